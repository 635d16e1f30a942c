// Token sampling from a logit vector, called once per step by the Python loop.
//
// The chain, in order: logit bias -> repetition / presence / frequency
// penalties over the last `penalty_last_n` accepted tokens -> (temperature 0:
// argmax, lowest id on ties) -> top-k -> softmax at the temperature -> top-p ->
// min-p -> a draw from a seeded generator (same seed, same logits => same
// tokens, on every platform: the generator and the draw are our own code).
#pragma once
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

namespace minfer {

struct SamplerParams {
    float temperature = 0.0f;      // 0: greedy
    int top_k = 0;                 // 0: off
    float top_p = 1.0f;            // 1: off
    float min_p = 0.0f;            // 0: off
    float repeat_penalty = 1.0f;   // 1: off
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    int penalty_last_n = 64;
    std::vector<std::pair<int, float>> logit_bias;
    uint64_t seed = 0;
};

class Sampler {
  public:
    // std::invalid_argument (ValueError in Python) naming the parameter that is out of range.
    Sampler(const SamplerParams& p, int n_vocab);
    int sample(const float* logits, int n_vocab);
    void accept(int token);
    void reset();  // history and generator back to the start
    const SamplerParams& params() const { return p_; }
    // Whether every token is the plain argmax of the logits (temperature 0, no bias, no penalties): then
    // the argmax may be taken where the logits are (Session.decode_greedy) instead of here.
    bool greedy() const {
        return p_.temperature == 0.0f && p_.logit_bias.empty() && p_.repeat_penalty == 1.0f &&
               p_.presence_penalty == 0.0f && p_.frequency_penalty == 0.0f;
    }

  private:
    double uniform();  // [0, 1)
    SamplerParams p_;
    int n_vocab_;
    std::deque<int> history_;
    uint64_t state_;
    std::vector<float> work_;
    std::vector<double> wt_;  // each candidate's unnormalized probability, by token id
    std::vector<int> ids_;
};

}  // namespace minfer
