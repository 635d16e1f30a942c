// Token sampling from a logit vector, called once per step by the Python loop.
//
// The chain, in order: logit bias -> repetition / presence / frequency
// penalties over the last `penalty_last_n` accepted tokens -> (temperature 0:
// argmax, lowest id on ties) -> top-k -> softmax at the temperature -> top-p ->
// min-p -> a draw from a seeded generator (same seed, same logits => same
// tokens, on every platform: the generator and the draw are our own code).
//
// Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): a draft token
// x drawn from a proposal q is kept with probability min(1, p(x) / q(x)), p the
// chain's distribution for the target's logits; otherwise the token is drawn
// from max(0, p - q), renormalized.  The kept or redrawn token is distributed
// exactly as p, whatever q was.
//
// Constrained decoding (minfer.constrain): `allow`, where given, is a bitmask of the tokens the grammar
// permits next (bit t of allow[t / 32], as llguidance writes it); every other token's logit is -inf before
// the chain, so greedy takes the argmax among the allowed and a draw never lands outside them.
#pragma once
#include <cstddef>
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

// A sampling distribution over the candidates the chain kept: ids and their
// probabilities (summing to 1).  What a draft was drawn from, for verify().
struct Distribution {
    std::vector<int> ids;
    std::vector<double> probs;
};

// The argmax (lowest id on ties) and its softmax probability at temperature 1: a greedy draft's confidence.
// Logits more than 20 below the maximum are left out of the sum (each adds under 2e-9 of the mass).  The
// probability is exact when it is at least p_min; below, the sum stops as soon as it shows that (an unsure
// draft over a flat distribution would otherwise cost an exp per token).
struct TopToken {
    int id;
    double prob;
};
TopToken top_token(const float* logits, int n_vocab, double p_min = 0.0);

class Sampler {
  public:
    // std::invalid_argument (ValueError in Python) naming the parameter that is out of range.
    Sampler(const SamplerParams& p, int n_vocab);
    int sample(const float* logits, int n_vocab, const uint32_t* allow = nullptr);
    // sample(), also giving the distribution the token was drawn from (a draft model's proposal).
    int sample(const float* logits, int n_vocab, Distribution& drawn_from, const uint32_t* allow = nullptr);
    // Speculative sampling: `draft` was proposed from q (nullptr: proposed deterministically, q a point
    // mass at it).  Returns `draft` if kept, else the token drawn in its place (never `draft`).
    int verify(const float* logits, int n_vocab, int draft, const Distribution* q, const uint32_t* allow = nullptr);
    // How many of a row's best logits the chain's token depends on: 1 where it is greedy(), top_k where it
    // samples from a top-k with no bias or penalty; 0 where it needs the whole row.  Then a batch step may find
    // each row's best where the logits are and send those alone (BatchRunner::step_best).
    int best_needed() const;
    // sample() from the k best logits of a row, ordered by logit descending, then id (vals[i] the logit of
    // ids[i]): the same token as sample() over the whole row.  An error unless 0 < best_needed() <= k.
    int sample_best(const float* vals, const int32_t* ids, int k);
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
    // The chain up to the draw: candidates candidate(0 .. keep_) with unnormalized weights wt_[id], their sum
    // total_.
    void prepare(const float* logits, int n_vocab, const uint32_t* allow);
    // The top-p / min-p cut over ids_ (sorted by logit) at total mass `sum`: keep_ and total_ set, or false where
    // the cut lies past ids_ and they are not every candidate (`complete`).
    bool cut_prefix(double sum, bool complete);
    // The chain past top-k: ids_ the k best tokens in order, vals their logits.
    void weigh_best(const float* vals);
    // The cut over more candidates than kSortedCut (ids_, in id order, holding it; within `span` temperatures of
    // the best logit mx) without sorting them all.
    static constexpr size_t kSortedCut = 2048;
    void cut_unsorted(const float* x, float mx, float inv_t, float span, double sum);
    int draw();
    int candidate(size_t i) const { return all_ ? int(i) : ids_[i]; }
    float weight(size_t i) const { return by_rank_ ? rank_wt_[i] : wt_[size_t(candidate(i))]; }  // candidate i's
    size_t keep_ = 0;
    bool all_ = false;  // every token a candidate, in id order (ids_ unused)
    int best_ = 0;      // the argmax: a draw's last resort
    double total_ = 0.0;
    std::vector<double> q_dense_;  // verify(): q by token id, zero outside the proposal
    SamplerParams p_;
    int n_vocab_;
    std::deque<int> history_;
    uint64_t state_;
    std::vector<float> work_;
    std::vector<float> wt_;       // each candidate's unnormalized probability, by token id (a whole-row chain)
    std::vector<float> rank_wt_;  // ... by rank, where by_rank_ (a top-k chain, greedy: what ids_ holds)
    bool by_rank_ = false;
    std::vector<double> blocks_;  // with all_: wt_'s block sums (weights.h)
    std::vector<float> maxes_;    // the logits' block maxima (weights.h)
    std::vector<double> bucket_mass_;  // cut_unsorted's
    std::vector<int> ring_;
    std::vector<int> ids_;
    std::vector<float> best_vals_;  // the logits of ids_ (top-k)
};

}  // namespace minfer
