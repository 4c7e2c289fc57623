#include "train/dpo.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/loss.h"
#include "model/decoder/lora.h"
#include "model/tokenizer/tokenizer.h"

namespace scalelab {

void validate_dpo_options(const DpoOptions& o) {
  if (!(o.beta > 0) || !std::isfinite(o.beta)) {
    throw InvalidInput("[--beta] " + std::to_string(o.beta) + " must be positive (trl's default is 0.1)");
  }
  if (!(o.label_smoothing >= 0 && o.label_smoothing < 0.5)) {
    throw InvalidInput("[--label-smoothing] " + std::to_string(o.label_smoothing) +
                       " must be in [0, 0.5) (the probability that a pair's preference is flipped; 0: off)");
  }
}

namespace {

tok::Tokenizer tokenizer_for(const TextSourceOptions& text) {
  return tok::find_tokenizer(text.tokenizer.empty() ? text.model : text.tokenizer);
}

std::vector<std::int32_t> to_i32(const std::vector<std::uint32_t>& ids) {
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

}  // namespace

PreferenceData read_preference_pairs(const std::string& path, std::int64_t seq_len, std::int64_t vocab_size,
                                     const TextSourceOptions& text) {
  std::ifstream in(path, std::ios::binary);
  const std::string flag = "[" + text.flag + "] ";
  if (!in) throw InvalidInput(flag + "cannot read '" + path + "' — give a JSONL file of {prompt, chosen, rejected}");
  const tok::Tokenizer tok = tokenizer_for(text);
  const std::optional<std::uint32_t> eos = tok.eos_id();
  PreferenceData out;
  out.path = path;
  std::string line;
  std::int64_t n = 0;
  auto fail = [&](const std::string& why) {
    throw InvalidInput(flag + path + " line " + std::to_string(n) + ": " + why);
  };
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("not valid JSON (") + e.what() + ") — one object {\"prompt\", \"chosen\", \"rejected\"} per line");
    }
    if (!j.is_object()) fail("not a JSON object — one object {\"prompt\", \"chosen\", \"rejected\"} per line");
    std::string fields[3];
    const char* names[3] = {"prompt", "chosen", "rejected"};
    for (int k = 0; k < 3; ++k) {
      if (!j.contains(names[k])) fail(std::string("the field \"") + names[k] + "\" is missing — each line needs prompt, chosen and rejected");
      if (!j[names[k]].is_string()) fail(std::string("the field \"") + names[k] + "\" is not a string");
      fields[k] = j[names[k]].get<std::string>();
    }
    for (int k = 1; k < 3; ++k) {
      if (fields[k].empty()) fail(std::string("the ") + names[k] + " completion is empty — a pair needs two non-empty completions");
    }
    PreferencePair p;
    p.line = n;
    p.prompt = to_i32(tok.encode(fields[0], true));
    p.chosen = to_i32(tok.encode(fields[1], false));
    p.rejected = to_i32(tok.encode(fields[2], false));
    if (eos) {
      p.chosen.push_back(static_cast<std::int32_t>(*eos));
      p.rejected.push_back(static_cast<std::int32_t>(*eos));
    }
    if (p.prompt.empty()) {
      fail("the prompt has no tokens (and the tokenizer adds no BOS), so nothing predicts the first completion "
           "token — give a non-empty prompt");
    }
    if (static_cast<std::int64_t>(p.prompt.size()) > seq_len) {
      fail("the prompt is " + std::to_string(p.prompt.size()) + " tokens, longer than the sequence (--seq-len " +
           std::to_string(seq_len) + ") — no completion token would fit: raise --seq-len or shorten the prompt");
    }
    for (const auto* v : {&p.prompt, &p.chosen, &p.rejected}) {
      for (std::int32_t id : *v) {
        if (id >= vocab_size) {
          fail("token id " + std::to_string(id) + " is outside the model's vocabulary of " + std::to_string(vocab_size) +
               " — the tokenizer does not belong to this model (--tokenizer)");
        }
      }
    }
    // Inputs are the first seq_len tokens of prompt + completion: a completion that does not fit
    // is cut at its end (trl truncates completions at their end too).
    const std::size_t room = static_cast<std::size_t>(seq_len + 1) - p.prompt.size();
    bool cut = false;
    for (auto* v : {&p.chosen, &p.rejected}) {
      if (v->size() > room) {
        v->resize(room);
        cut = true;
      }
    }
    out.truncated += cut;
    out.pairs.push_back(std::move(p));
  }
  if (out.pairs.empty()) throw InvalidInput(flag + path + " has no preference pairs — it is empty");
  return out;
}

void fill_pair_rows(const PreferencePair& p, std::int64_t row, std::int64_t B, std::int64_t S, std::int32_t pad_id,
                    Batch& batch) {
  std::int32_t* in = batch.inputs.data<std::int32_t>();
  std::int32_t* tg = batch.targets.data<std::int32_t>();
  for (int k = 0; k < 2; ++k) {
    const std::vector<std::int32_t>& c = k == 0 ? p.chosen : p.rejected;
    const std::int64_t r = k == 0 ? row : B + row;
    std::int32_t* x = in + r * S;
    std::int32_t* y = tg + r * S;
    const std::int64_t P = static_cast<std::int64_t>(p.prompt.size()), n = P + static_cast<std::int64_t>(c.size());
    auto tok_at = [&](std::int64_t i) { return i < P ? p.prompt[static_cast<std::size_t>(i)] : c[static_cast<std::size_t>(i - P)]; };
    for (std::int64_t t = 0; t < S; ++t) {
      if (t + 1 < n) {
        x[t] = tok_at(t);
        // The target of input t is token t + 1: scored when it is a completion token.
        y[t] = t + 1 >= P ? tok_at(t + 1) : kernels::kIgnoreIndex;
      } else {
        x[t] = pad_id;
        y[t] = kernels::kIgnoreIndex;
      }
    }
  }
}

namespace {

class PreferenceSource final : public DataSource {
 public:
  PreferenceSource(PreferenceData data, std::int64_t B, std::int64_t S, int rank, int world)
      : d_(std::move(data)), B_(B), S_(S), rank_(rank), world_(world) {}
  void next(Batch& batch) override {
    SCALELAB_CHECK(batch.batch == 2 * B_ && batch.seq == S_, "[dpo] the batch is not [2·micro-batch, seq-len]");
    const std::int64_t N = static_cast<std::int64_t>(d_.pairs.size());
    for (std::int64_t i = 0; i < B_; ++i) {
      const std::int64_t g = (step_ * world_ + rank_) * B_ + i;
      fill_pair_rows(d_.pairs[static_cast<std::size_t>(g % N)], i, B_, S_, 0, batch);
    }
    ++step_;
  }
  // Every micro-batch is a function of its index (file order, wrapping around): --resume seeks.
  void skip(std::int64_t micro_batches, Batch&) override { step_ += micro_batches; }
  std::string describe() const override {
    return "pairs " + d_.path + " (" + std::to_string(d_.pairs.size()) + " preference pairs" +
           (d_.truncated ? ", " + std::to_string(d_.truncated) + " with a completion cut to --seq-len" : "") + ")";
  }
  std::int64_t num_samples() const override { return static_cast<std::int64_t>(d_.pairs.size()); }

 private:
  PreferenceData d_;
  std::int64_t B_, S_;
  int rank_, world_;
  std::int64_t step_ = 0;
};

// log σ(x), stable on both sides.
double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }
double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

// Per-row sums of a [rows, S] fp32 tensor read back to the host.
std::vector<double> row_sums(const Tensor& logp, std::int64_t rows, std::int64_t S) {
  std::vector<float> h(static_cast<std::size_t>(rows * S));
  logp.copy_to_host(h.data());
  std::vector<double> s(static_cast<std::size_t>(rows), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t t = 0; t < S; ++t) s[static_cast<std::size_t>(r)] += h[static_cast<std::size_t>(r * S + t)];
  return s;
}

}  // namespace

std::unique_ptr<DataSource> make_preference_source(PreferenceData data, std::int64_t micro_batch, std::int64_t seq_len,
                                                   int rank, int world) {
  return std::make_unique<PreferenceSource>(std::move(data), micro_batch, seq_len, rank, world);
}

void DpoStats::add(const DpoStats& s) {
  const double a = static_cast<double>(pairs), b = static_cast<double>(s.pairs), n = a + b;
  if (n == 0) return;
  loss = (loss * a + s.loss * b) / n;
  rewards_chosen = (rewards_chosen * a + s.rewards_chosen * b) / n;
  rewards_rejected = (rewards_rejected * a + s.rewards_rejected * b) / n;
  margin = (margin * a + s.margin * b) / n;
  accuracy = (accuracy * a + s.accuracy * b) / n;
  pairs += s.pairs;
}

nlohmann::json DpoStats::to_json() const {
  return {{"loss", loss},
          {"rewards_chosen", rewards_chosen},
          {"rewards_rejected", rewards_rejected},
          {"reward_margin", margin},
          {"reward_accuracy", accuracy}};
}

DpoStats dpo_loss(const std::vector<double>& policy, const std::vector<double>& reference, double beta,
                  double label_smoothing, double grad_scale, std::vector<double>* grad) {
  SCALELAB_CHECK(policy.size() == reference.size() && policy.size() % 2 == 0 && !policy.empty(),
                 "[dpo] log-probabilities of 2B rows expected");
  const std::size_t B = policy.size() / 2;
  const double eps = label_smoothing;
  DpoStats s;
  s.pairs = static_cast<std::int64_t>(B);
  if (grad) grad->assign(policy.size(), 0.0);
  for (std::size_t i = 0; i < B; ++i) {
    const double pc = policy[i], pr = policy[B + i], rc = reference[i], rr = reference[B + i];
    const double z = beta * ((pc - pr) - (rc - rr));
    s.loss += -(1 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z);
    const double cr = beta * (pc - rc), rj = beta * (pr - rr);
    s.rewards_chosen += cr;
    s.rewards_rejected += rj;
    s.margin += cr - rj;
    s.accuracy += cr > rj ? 1.0 : 0.0;
    if (grad) {
      // d loss_i / dz = −(1 − ε)·σ(−z) + ε·σ(z); dz/dπ_c = β, dz/dπ_r = −β; the mean over B pairs.
      const double dz = -(1 - eps) * sigmoid(-z) + eps * sigmoid(z);
      (*grad)[i] = grad_scale * beta * dz / static_cast<double>(B);
      (*grad)[B + i] = -grad_scale * beta * dz / static_cast<double>(B);
    }
  }
  const double inv = 1.0 / static_cast<double>(B);
  s.loss *= inv;
  s.rewards_chosen *= inv;
  s.rewards_rejected *= inv;
  s.margin *= inv;
  s.accuracy *= inv;
  return s;
}

DpoStats dpo_micro_step(Model& policy, Model* reference, const Batch& batch, double beta, double label_smoothing,
                        float grad_scale, ExecContext& ctx) {
  SCALELAB_CHECK(batch.batch % 2 == 0, "[dpo] the batch must hold [chosen; rejected] rows");
  const std::int64_t rows = batch.batch, S = batch.seq, T = rows * S;
  const bool meta = ctx.device() == DeviceType::kMeta;
  std::vector<double> ref_sums;
  {
    AllocRegion region("reference forward");
    Tensor ref_logp = Tensor::empty({T}, DType::kF32, *ctx.alloc, "reference log-probabilities");
    if (reference != nullptr) {
      reference->forward_logprobs(ref_logp, batch, ctx);
    } else {
      AdaptersOff off;
      policy.forward_logprobs(ref_logp, batch, ctx);
    }
    if (!meta) ref_sums = row_sums(ref_logp, rows, S);
  }
  DpoStats stats;
  policy.forward_backward_logprobs(
      batch,
      [&](const Tensor& logp, Tensor& dlogp, ExecContext&) {
        if (meta) return 0.0;
        const std::vector<double> pol = row_sums(logp, rows, S);
        std::vector<double> g;
        stats = dpo_loss(pol, ref_sums, beta, label_smoothing, grad_scale, &g);
        // Every token of a row gets the row's gradient (the sum's); ignored targets get none
        // from the kernel whatever is written here.
        std::vector<float> h(static_cast<std::size_t>(T));
        for (std::int64_t r = 0; r < rows; ++r)
          std::fill_n(h.begin() + r * S, S, static_cast<float>(g[static_cast<std::size_t>(r)]));
        dlogp.copy_from_host(h.data());
        return stats.loss;
      },
      ctx);
  return stats;
}

DpoStats evaluate_dpo(Model& policy, Model* reference, const PreferenceData& data, StagedBatch& batch, double beta,
                      double label_smoothing, const DpoEvalOptions& o, ExecContext& ctx) {
  const std::int64_t rows = batch.host.batch, S = batch.host.seq, B = rows / 2, T = rows * S;
  SCALELAB_CHECK(rows % 2 == 0 && B > 0, "[dpo] the evaluation batch must hold [chosen; rejected] rows");
  const std::int64_t N = static_cast<std::int64_t>(data.pairs.size());
  SCALELAB_CHECK(N > 0, "[dpo] no held-out pairs to evaluate");
  std::int64_t batches = o.batches;
  if (batches <= 0) batches = (N + B * o.world - 1) / (B * o.world);  // the whole set once
  // Sums over pairs (weighted by pairs, so the result is the mean over every evaluated pair).
  double sum[5] = {0, 0, 0, 0, 0}, count = 0;
  for (std::int64_t m = 0; m < batches; ++m) {
    std::int64_t valid = 0;
    for (std::int64_t i = 0; i < B; ++i) {
      const std::int64_t g = (m * o.world + o.rank) * B + i;  // the pair's index in the set
      // Past the end of "the whole set": a wrapped pair fills the row but is not counted.
      if (o.batches > 0 || g < N) ++valid;
      fill_pair_rows(data.pairs[static_cast<std::size_t>(g % N)], i, B, S, 0, batch.host);
    }
    if (valid == 0) continue;
    batch.upload();
    std::vector<double> ref, pol;
    {
      Tensor logp = Tensor::empty({T}, DType::kF32, *ctx.alloc, "reference log-probabilities");
      if (reference != nullptr) {
        reference->forward_logprobs(logp, batch.device, ctx);
      } else {
        AdaptersOff off;
        policy.forward_logprobs(logp, batch.device, ctx);
      }
      ref = row_sums(logp, rows, S);
    }
    {
      Tensor logp = Tensor::empty({T}, DType::kF32, *ctx.alloc, "token log-probabilities");
      policy.forward_logprobs(logp, batch.device, ctx);
      pol = row_sums(logp, rows, S);
    }
    // The counted pairs are the first `valid` of the micro-batch: rows [0, valid) and [B, B + valid).
    auto counted = [&](const std::vector<double>& v) {
      std::vector<double> out(v.begin(), v.begin() + valid);
      out.insert(out.end(), v.begin() + B, v.begin() + B + valid);
      return out;
    };
    const DpoStats st = dpo_loss(counted(pol), counted(ref), beta, label_smoothing, 1.0, nullptr);
    const double n = static_cast<double>(valid);
    sum[0] += st.loss * n;
    sum[1] += st.rewards_chosen * n;
    sum[2] += st.rewards_rejected * n;
    sum[3] += st.margin * n;
    sum[4] += st.accuracy * n;
    count += n;
  }
  if (o.sum_over_ranks) {
    for (double& v : sum) v = o.sum_over_ranks(v);
    count = o.sum_over_ranks(count);
  }
  SCALELAB_CHECK(count > 0, "[dpo] no held-out pair was evaluated");
  DpoStats r;
  r.loss = sum[0] / count;
  r.rewards_chosen = sum[1] / count;
  r.rewards_rejected = sum[2] / count;
  r.margin = sum[3] / count;
  r.accuracy = sum[4] / count;
  r.pairs = static_cast<std::int64_t>(count);
  return r;
}

}  // namespace scalelab
