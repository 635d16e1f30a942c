#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/error.h"
#include "sampling/scan.h"
#include "sampling/weights.h"

namespace minfer {

namespace {
void require(bool ok, const std::string& msg) {
    if (!ok) throw std::invalid_argument(msg);
}
}  // namespace

Sampler::Sampler(const SamplerParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab), state_(p.seed) {
    require(std::isfinite(p.temperature) && p.temperature >= 0, "temperature must be >= 0, got " + std::to_string(p.temperature));
    require(p.top_k >= 0, "top_k must be >= 0 (0 = off), got " + std::to_string(p.top_k));
    require(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p must be in (0, 1], got " + std::to_string(p.top_p));
    require(std::isfinite(p.min_p) && p.min_p >= 0 && p.min_p <= 1, "min_p must be in [0, 1], got " + std::to_string(p.min_p));
    require(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0,
            "repeat_penalty must be > 0 (1 = off), got " + std::to_string(p.repeat_penalty));
    require(std::isfinite(p.presence_penalty), "presence_penalty must be finite");
    require(std::isfinite(p.frequency_penalty), "frequency_penalty must be finite");
    require(p.penalty_last_n >= 0, "penalty_last_n must be >= 0, got " + std::to_string(p.penalty_last_n));
    for (auto& [tok, bias] : p.logit_bias) {
        require(tok >= 0 && tok < n_vocab, "logit_bias token " + std::to_string(tok) + " is out of range [0, " +
                                               std::to_string(n_vocab) + ")");
        require(!std::isnan(bias), "logit_bias for token " + std::to_string(tok) + " is NaN");
    }
}

void Sampler::reset() {
    history_.clear();
    state_ = p_.seed;
}

void Sampler::accept(int token) {
    if (p_.penalty_last_n == 0) return;
    history_.push_back(token);
    while (int(history_.size()) > p_.penalty_last_n) history_.pop_front();
}

double Sampler::uniform() {
    // splitmix64: tiny, well mixed, and identical everywhere
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return double(z >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}

void Sampler::prepare(const float* logits, int n_vocab, const uint32_t* allow) {
    if (n_vocab != n_vocab_)
        throw MinferError(strfmt("sampler: %d logits for a vocabulary of %d", n_vocab, n_vocab_));
    const int bad = first_nan(logits, n_vocab);
    if (bad >= 0) throw MinferError(strfmt("sampler: logit %d is NaN (the model produced NaN)", bad));
    const size_t n = size_t(n_vocab);
    all_ = by_rank_ = false;
    auto one = [&](int t) {  // greedy: the only candidate
        ids_.assign(1, t);
        rank_wt_.assign(1, 1.0f);
        by_rank_ = true;
        total_ = 1.0;
        keep_ = 1;
    };
    const bool penalties = !history_.empty() &&
                           (p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f);
    // greedy among the allowed tokens; -1: the constraint allows none
    auto argmax = [&](const float* x) {
        const int t = allow ? first_argmax_allowed(x, n_vocab, allow) : first_argmax(x, n_vocab);
        if (t < 0) throw MinferError("sampler: the constraint allows no token");
        return t;
    };
    if (p_.temperature == 0.0f && p_.logit_bias.empty() && !penalties)
        return one(argmax(logits));  // greedy on the logits as they are: no copy
    // a copy only where a mask, a bias or a penalty changes logits (a row is 0.6 MB at 152k)
    const bool changes = allow || !p_.logit_bias.empty() || penalties;
    if (changes) work_.assign(logits, logits + n_vocab);
    if (allow && mask_disallowed(work_.data(), n_vocab, allow) == 0)
        throw MinferError("sampler: the constraint allows no token");
    // only the tokens touched below can turn NaN (a bias of -inf on a logit of +inf): each is checked as it changes
    auto changed = [&](int t, const char* by) {
        if (std::isnan(work_[size_t(t)])) throw MinferError(strfmt("sampler: logit %d is NaN after its %s", t, by));
    };
    for (auto& [tok, bias] : p_.logit_bias) {
        work_[size_t(tok)] += bias;
        changed(tok, "logit_bias");
    }
    if (penalties) {
        std::map<int, int> count;
        for (int t : history_) count[t]++;
        for (auto [t, c] : count) {
            if (t < 0 || t >= n_vocab) continue;
            float& l = work_[size_t(t)];
            l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
            l -= float(c) * p_.frequency_penalty + p_.presence_penalty;
            changed(t, "penalties");
        }
    }
    const float* x = changes ? work_.data() : logits;
    if (p_.temperature == 0.0f) return one(argmax(x));  // greedy: the first maximum
    // Candidates: every token in id order, or the top-k by logit (descending, then id), the best first.
    const size_t k = p_.top_k > 0 ? std::min(size_t(p_.top_k), n) : n;
    if (k < n) {
        top_k(x, n_vocab, int(k), ids_);
        best_vals_.resize(k);
        for (size_t i = 0; i < k; i++) best_vals_[i] = x[ids_[i]];
        return weigh_best(best_vals_.data());
    }
    best_ = first_argmax(x, n_vocab);
    const float mx = x[best_];
    if (!std::isfinite(mx)) throw MinferError("sampler: every candidate logit is -inf (logit_bias removed them all?)");
    const float inv_t = 1.0f / p_.temperature;
    const bool cut = p_.top_p < 1.0f || p_.min_p > 0.0f;
    wt_.resize(n);  // (only here: a top-k's weights are by rank, not a vocabulary's worth a sampler)
    softmax_weights(x, n_vocab, mx, inv_t, wt_.data());
    const double sum = block_sums(wt_.data(), n_vocab, blocks_);
    if (!cut) {
        all_ = true;
        keep_ = n;
        total_ = sum;
        return;
    }
    // A cut needs the order of the prefix it keeps only: the tokens within d temperatures of the best logit, d
    // raised until the cut falls among them (a quarter more each step past 8).  Outside, a weight is below e^-d,
    // so a min-p cut above that is complete; for top-p the candidates are sorted once they hold its mass, or,
    // where they are many (a flat distribution), cut without sorting them all.
    block_maxes(x, n_vocab, maxes_);
    for (float d = 4.0f;; d = d < 8.0f ? 2.0f * d : 1.25f * d) {
        const bool every = d > 64.0f, min_p_done = p_.min_p > 0.0f && 2.0 * std::exp(-double(d)) < double(p_.min_p);
        const float tau = every ? -INFINITY : mx - d * p_.temperature;
        ids_.clear();  // the tokens with logit >= tau, in id order, from the blocks that reach it
        for (size_t b = 0; b < maxes_.size(); b++)
            if (maxes_[b] >= tau)
                for (int i = int(b) * kWeightBlock, e = std::min(n_vocab, i + kWeightBlock); i < e; i++)
                    if (x[i] >= tau) ids_.push_back(i);
        if (!every && !min_p_done) {
            double mass = 0.0;
            for (int t : ids_) mass += double(wt_[size_t(t)]);
            if (mass < double(p_.top_p) * sum) continue;
        }
        if (ids_.size() > kSortedCut) return cut_unsorted(x, mx, inv_t, every ? 88.0f : d, sum);
        std::sort(ids_.begin(), ids_.end(), ByLogit{x});
        if (cut_prefix(sum, every || min_p_done)) return;
    }
}

void Sampler::weigh_best(const float* vals) {
    best_ = ids_[0];
    const float mx = vals[0];
    if (!std::isfinite(mx)) throw MinferError("sampler: every candidate logit is -inf (logit_bias removed them all?)");
    const float inv_t = 1.0f / p_.temperature;
    rank_wt_.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); i++) rank_wt_[i] = exp_nonpositive((vals[i] - mx) * inv_t);
    by_rank_ = true;
    double sum = 0.0;
    for (float w : rank_wt_) sum += double(w);
    if (p_.top_p < 1.0f || p_.min_p > 0.0f) {
        cut_prefix(sum, true);  // the top k are every candidate: the cut lies among them
    } else {
        keep_ = ids_.size();
        total_ = sum;
    }
}

int Sampler::best_needed() const {
    if (greedy()) return 1;
    const bool plain = p_.logit_bias.empty() && p_.repeat_penalty == 1.0f && p_.presence_penalty == 0.0f &&
                       p_.frequency_penalty == 0.0f;
    return plain && p_.top_k > 0 && p_.top_k < n_vocab_ ? p_.top_k : 0;
}

int Sampler::sample_best(const float* vals, const int32_t* ids, int k) {
    const int need = best_needed();
    if (need == 0 || need > k)
        throw MinferError(strfmt("sampler: its chain needs %s, not the %d best logits", need ? strfmt("the %d best", need).c_str()
                                 : "the whole row (no top-k, a bias or a penalty)", k));
    for (int i = 0; i < need; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab_)
            throw MinferError(strfmt("sampler: candidate token %d is out of range [0, %d)", ids[i], n_vocab_));
    if (p_.temperature == 0.0f) return ids[0];  // the argmax (the lowest id of equal maxima)
    all_ = false;
    ids_.assign(ids, ids + need);
    weigh_best(vals);
    return draw();
}

void Sampler::cut_unsorted(const float* x, float mx, float inv_t, float span, double sum) {
    // min-p keeps the tokens at or above it (the best always); top-p buckets the candidates by their exponent
    // (mx - x) / t, which orders them as their logits do, finds the bucket where the mass reaches top_p, and
    // sorts that bucket's tokens only.  Kept: the buckets before it in id order, then its tokens by logit.
    auto keeps = [&](int t) { return t == best_ || double(wt_[size_t(t)]) >= double(p_.min_p); };
    auto finish = [&] {
        ids_.erase(std::remove_if(ids_.begin(), ids_.end(), [&](int t) { return !keeps(t); }), ids_.end());
        keep_ = ids_.size();
        total_ = 0.0;
        for (int t : ids_) total_ += double(wt_[size_t(t)]);
    };
    if (p_.top_p >= 1.0f) return finish();
    constexpr int kBuckets = 4096;
    const float scale = float(kBuckets) / span;
    auto bucket = [&](int t) {
        const float b = (mx - x[t]) * inv_t * scale;
        return b < float(kBuckets - 1) ? int(b) : kBuckets - 1;
    };
    bucket_mass_.assign(kBuckets, 0.0);
    for (int t : ids_) bucket_mass_[size_t(bucket(t))] += double(wt_[size_t(t)]);
    const double target = double(p_.top_p) * sum;
    double before = 0.0;  // the mass of the buckets before the cut's
    int cut = kBuckets - 1;
    for (int b = 0; b < kBuckets; b++) {
        if (before + bucket_mass_[size_t(b)] >= target) {
            cut = b;
            break;
        }
        before += bucket_mass_[size_t(b)];
    }
    ring_.clear();
    size_t kept = 0;
    for (int t : ids_) {
        const int b = bucket(t);
        if (b < cut) ids_[kept++] = t;
        else if (b == cut) ring_.push_back(t);
    }
    ids_.resize(kept);
    std::sort(ring_.begin(), ring_.end(), ByLogit{x});
    double cum = before;
    for (int t : ring_) {
        ids_.push_back(t);
        cum += double(wt_[size_t(t)]);
        if (cum >= target) break;
    }
    finish();
}

bool Sampler::cut_prefix(double sum, bool complete) {
    // top-p: the shortest prefix (by logit) whose mass reaches top_p; min-p: weights below min_p x the best
    // (whose weight is e^0 = 1) end it
    double cum = 0.0;
    size_t i = 0;
    const size_t m = ids_.size();
    for (; i < m; i++) {
        const double w = double(weight(i));
        if (p_.min_p > 0.0f && i > 0 && w < double(p_.min_p)) break;
        cum += w;
        if (p_.top_p < 1.0f && cum >= double(p_.top_p) * sum) {
            i++;
            break;
        }
    }
    if (i == m && !complete) return false;  // the cut lies past these candidates
    keep_ = std::max<size_t>(i, 1);
    total_ = 0.0;
    for (size_t j = 0; j < keep_; j++) total_ += double(weight(j));
    return true;
}

int Sampler::draw() {
    if (p_.temperature == 0.0f) return ids_[0];  // greedy draws nothing: the generator stays where it was
    double r = uniform() * total_;
    if (all_) {  // every token in id order: find the block by its sum, then the token in it
        const int n = n_vocab_;
        for (size_t b = 0; b < blocks_.size(); b++) {
            if (r >= blocks_[b]) {
                r -= blocks_[b];
                continue;
            }
            const int lo = int(b) * kWeightBlock, hi = std::min(n, lo + kWeightBlock);
            int last = -1;
            for (int i = lo; i < hi; i++) {
                if (wt_[size_t(i)] > 0.0f) last = i;
                r -= double(wt_[size_t(i)]);
                if (r < 0) return i;
            }
            if (last >= 0) return last;  // rounding left r >= 0 in a block with mass
        }
        for (int i = n; i-- > 0;)  // rounding left r >= 0 past the last block: the last token with mass
            if (wt_[size_t(i)] > 0.0f) return i;
        return best_;
    }
    for (size_t i = 0; i < keep_; i++) {
        r -= double(weight(i));
        if (r < 0) return candidate(i);
    }
    for (size_t i = keep_; i-- > 0;)  // rounding left r >= 0: the last candidate with mass (never a masked one)
        if (weight(i) > 0.0f) return candidate(i);
    return candidate(keep_ - 1);
}

TopToken top_token(const float* logits, int n_vocab, double p_min) {
    if (n_vocab <= 0) throw MinferError("top_token: no logits");
    const int bad = first_nan(logits, n_vocab);
    if (bad >= 0) throw MinferError(strfmt("top_token: logit %d is NaN (the model produced NaN)", bad));
    const int best = first_argmax(logits, n_vocab);
    const float mx = logits[best];
    if (!std::isfinite(mx)) return {best, 1.0};
    const double limit = p_min > 0.0 ? 1.0 / p_min : HUGE_VAL;
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > mx - 20.0f) {
            sum += std::exp(double(logits[i]) - double(mx));
            if (sum > limit) break;  // prob < p_min already
        }
    return {best, 1.0 / sum};
}

int Sampler::sample(const float* logits, int n_vocab, const uint32_t* allow) {
    prepare(logits, n_vocab, allow);
    return draw();
}

int Sampler::sample(const float* logits, int n_vocab, Distribution& drawn_from, const uint32_t* allow) {
    prepare(logits, n_vocab, allow);
    drawn_from.ids.resize(keep_);
    drawn_from.probs.resize(keep_);
    for (size_t i = 0; i < keep_; i++) {
        drawn_from.ids[i] = candidate(i);
        drawn_from.probs[i] = double(weight(i)) / total_;
    }
    return draw();
}

int Sampler::verify(const float* logits, int n_vocab, int draft, const Distribution* q, const uint32_t* allow) {
    if (draft < 0 || draft >= n_vocab_) throw MinferError(strfmt("sampler: draft token %d is out of range", draft));
    prepare(logits, n_vocab, allow);
    if (p_.temperature == 0.0f) return ids_[0];  // p is a point mass: the draft is kept iff it is the argmax
    // q by token id (a point mass at the draft when no q is given), zero elsewhere
    q_dense_.resize(size_t(n_vocab_), 0.0);
    if (q) {
        if (q->ids.size() != q->probs.size()) throw MinferError("sampler: a distribution with ids and probs of different sizes");
        for (size_t i = 0; i < q->ids.size(); i++) {
            const int t = q->ids[i];
            if (t < 0 || t >= n_vocab_) throw MinferError(strfmt("sampler: distribution token %d is out of range", t));
            q_dense_[size_t(t)] = q->probs[i];
        }
    } else {
        q_dense_[size_t(draft)] = 1.0;
    }
    auto clear = [&] {
        if (q)
            for (int t : q->ids) q_dense_[size_t(t)] = 0.0;
        else
            q_dense_[size_t(draft)] = 0.0;
    };
    const double qx = q_dense_[size_t(draft)];
    if (!(qx > 0.0)) {
        clear();
        throw MinferError(strfmt("sampler: draft token %d has no probability in its proposal", draft));
    }
    double px = 0.0;  // p(draft): its weight if the chain kept it
    for (size_t i = 0; i < keep_; i++)
        if (candidate(i) == draft) px = double(weight(i)) / total_;
    if (uniform() * qx < px) {  // kept with probability min(1, px / qx)
        clear();
        return draft;
    }
    // Rejected (so px < qx): draw from the residual max(0, p - q), which is zero at the draft.
    double rest = 0.0;
    for (size_t i = 0; i < keep_; i++) {
        const int t = candidate(i);
        rest += std::max(0.0, double(weight(i)) / total_ - q_dense_[size_t(t)]);
    }
    int out = -1;
    if (rest > 0.0) {
        double r = uniform() * rest;
        for (size_t i = 0; i < keep_ && out < 0; i++) {
            const int t = candidate(i);
            const double w = std::max(0.0, double(weight(i)) / total_ - q_dense_[size_t(t)]);
            r -= w;
            if (r < 0 && w > 0.0) out = t;
        }
        for (size_t i = keep_; out < 0 && i-- > 0;)  // rounding left r >= 0: the last token with residual mass
            if (candidate(i) != draft && double(weight(i)) / total_ > q_dense_[size_t(candidate(i))])
                out = candidate(i);
    }
    clear();
    if (out < 0) throw MinferError("sampler: a rejected draft left no residual probability (p equals q)");
    return out;
}

}  // namespace minfer
