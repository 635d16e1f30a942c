#include "sampling/weights.h"

#include <algorithm>
#include <cmath>

namespace minfer {

void softmax_weights(const float* x, int n, float mx, float inv_t, float* w) {
    for (int i = 0; i < n; i++) w[i] = exp_nonpositive((x[i] - mx) * inv_t);
}

double block_sums(const float* w, int n, std::vector<double>& sums) {
    sums.resize(size_t((n + kWeightBlock - 1) / kWeightBlock));
    double total = 0.0;
    for (size_t b = 0; b < sums.size(); b++) {
        const int lo = int(b) * kWeightBlock, hi = std::min(n, lo + kWeightBlock);
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += double(w[i + j]);
        for (int j = 0; i < hi; i++, j++) acc[j] += double(w[i]);
        sums[b] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        total += sums[b];
    }
    return total;
}

void block_maxes(const float* x, int n, std::vector<float>& maxes) {
    maxes.resize(size_t((n + kWeightBlock - 1) / kWeightBlock));
    for (size_t b = 0; b < maxes.size(); b++) {
        const int lo = int(b) * kWeightBlock, hi = std::min(n, lo + kWeightBlock);
        float acc[16];
        for (int j = 0; j < 16; j++) acc[j] = -INFINITY;
        int i = lo;
        for (; i + 16 <= hi; i += 16)
            for (int j = 0; j < 16; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
        for (int j = 0; i < hi; i++, j++) acc[j] = x[i] > acc[j] ? x[i] : acc[j];
        float m = acc[0];
        for (int j = 1; j < 16; j++) m = acc[j] > m ? acc[j] : m;
        maxes[b] = m;
    }
}

}  // namespace minfer
