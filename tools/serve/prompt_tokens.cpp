#include "tools/serve/prompt_tokens.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "tools/cli/c_api_text.h"

namespace mz::serve {

namespace {

// How many bytes a and b share from their start.
size_t SharedBytes(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  constexpr size_t kStep = 64;
  while (i + kStep <= n && std::memcmp(a.data() + i, b.data() + i, kStep) == 0) i += kStep;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// How far back from the shared prefix's end a control token is looked for (tokens): a cut further
// back saves little over tokenizing the whole text.
constexpr size_t kMaxCutScan = 8192;

}  // namespace

bool PromptTokens::Probe(const mz_model* model) {
  if (probed_ != 0) return probed_ > 0;
  probed_ = -1;
  std::vector<mz_token> with, without;
  mz_model_info info{};
  if (cli::TokenizeText(model, "a", true, true, &with) != MZ_OK ||
      cli::TokenizeText(model, "a", false, true, &without) != MZ_OK || without.empty() ||
      mz_model_get_info(model, &info) != MZ_OK || info.n_vocab <= 0)
    return false;
  if (with == without) {
    adds_bos_ = false;
  } else if (with.size() == without.size() + 1 && std::equal(without.begin(), without.end(), with.begin() + 1)) {
    adds_bos_ = true;
  } else {
    return false;  // add_special appends (EOS) or changes the text's tokens: tokenize whole
  }
  n_vocab_ = info.n_vocab;
  kind_.reset(new std::atomic<int8_t>[size_t(n_vocab_)]);
  for (int32_t i = 0; i < n_vocab_; ++i) kind_[size_t(i)].store(0, std::memory_order_relaxed);
  probed_ = 1;
  return true;
}

bool PromptTokens::IsControl(const mz_model* model, mz_token t, const std::string& piece) {
  if (t < 0 || t >= n_vocab_ || piece.empty()) return false;
  std::atomic<int8_t>& k = kind_[size_t(t)];
  if (int8_t v = k.load(std::memory_order_relaxed); v != 0) return v == 1;
  // A control token: its text is read as that one token only when special tokens are parsed
  // (llama.cpp's CONTROL attribute; a USER_DEFINED token is read as itself either way and is not
  // taken as a cut, which only costs reuse).
  std::vector<mz_token> parsed, plain;
  const bool control = cli::TokenizeText(model, piece, false, true, &parsed) == MZ_OK && parsed.size() == 1 &&
                       parsed[0] == t && cli::TokenizeText(model, piece, false, false, &plain) == MZ_OK &&
                       !(plain.size() == 1 && plain[0] == t);
  k.store(control ? 1 : 2, std::memory_order_relaxed);
  return control;
}

bool PromptTokens::Walk(const mz_model* model, const std::string& text, const std::vector<mz_token>& tokens,
                        size_t from, size_t at, std::vector<uint32_t>* ends) {
  if (text.size() > UINT32_MAX) return false;
  ends->reserve(ends->size() + tokens.size() - from);
  for (size_t k = from; k < tokens.size(); ++k) {
    const std::string piece = cli::TokenPiece(model, tokens[k]);
    if (piece.empty() || text.compare(at, piece.size(), piece) != 0) return false;
    at += piece.size();
    ends->push_back(uint32_t(at));
  }
  return at == text.size();
}

void PromptTokens::Insert(std::shared_ptr<const Entry> e) {
  if (e->bytes() > opt_.max_bytes || opt_.max_entries == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    const Entry& o = **it;
    // An entry whose text begins e's is subsumed: every cut it offers, e offers with the same tokens.
    if (o.text.size() <= e->text.size() && std::memcmp(o.text.data(), e->text.data(), o.text.size()) == 0) {
      bytes_ -= o.bytes();
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  bytes_ += e->bytes();
  lru_.push_front(std::move(e));
  while (lru_.size() > 1 && (lru_.size() > opt_.max_entries || bytes_ > opt_.max_bytes)) {
    bytes_ -= lru_.back()->bytes();
    lru_.pop_back();
  }
}

int PromptTokens::Tokenize(const mz_model* model, const std::string& text, std::vector<mz_token>* out,
                           Stats* stats) {
  Stats st;
  std::vector<std::pair<size_t, std::shared_ptr<const Entry>>> shared;  // (bytes shared, entry)
  bool usable = false;
  bool adds_bos = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!model_) model_ = model;
    usable = model == model_ && Probe(model);
    adds_bos = adds_bos_;
    if (usable) {
      for (const auto& e : lru_) {
        const size_t n = SharedBytes(e->text, text);
        if (n > 0) shared.emplace_back(n, e);
      }
    }
  }
  // The cut: the latest control token of a cached prompt that lies wholly in the text shared with it.
  std::shared_ptr<const Entry> base;
  size_t cut = 0;  // tokens of base reused: base->tokens[0, cut); the tail starts at base's token cut
  for (const auto& [n, e] : shared) {
    const size_t last = size_t(std::upper_bound(e->ends.begin(), e->ends.end(), uint32_t(n)) - e->ends.begin());
    const size_t stop = last > kMaxCutScan ? last - kMaxCutScan : 0;
    for (size_t i = last; i-- > std::max<size_t>(stop, 1);) {
      if (i <= cut) break;  // no better than the cut already found
      const size_t start = e->ends[i - 1];
      if (e->ends[i] <= start) continue;
      if (IsControl(model, e->tokens[i], e->text.substr(start, e->ends[i] - start))) {
        base = e;
        cut = i;
        break;
      }
    }
  }
  if (base) {
    const size_t start = base->ends[cut - 1];
    std::vector<mz_token> tail;
    // The tail starts with the control token base holds there; if the tokenizer reads it otherwise
    // here, the text is not cut where the cached one was: tokenize whole.
    if (cli::TokenizeText(model, text.substr(start), false, true, &tail) == MZ_OK && !tail.empty() &&
        tail[0] == base->tokens[cut]) {
      auto e = std::make_shared<Entry>();
      e->tokens.reserve(cut + tail.size());
      e->tokens.assign(base->tokens.begin(), base->tokens.begin() + ptrdiff_t(cut));
      e->tokens.insert(e->tokens.end(), tail.begin(), tail.end());
      *out = e->tokens;
      st.reused = int(cut);
      st.tokenized = int(tail.size());
      if (stats) *stats = st;
      e->ends.assign(base->ends.begin(), base->ends.begin() + ptrdiff_t(cut));
      if (Walk(model, text, e->tokens, cut, start, &e->ends)) {
        e->text = text;
        Insert(std::move(e));
      }
      return MZ_OK;
    }
  }
  const int rc = cli::TokenizeText(model, text, true, true, out);
  st.tokenized = int(out->size());
  if (stats) *stats = st;
  if (rc != MZ_OK || !usable || out->empty()) return rc;
  auto e = std::make_shared<Entry>();
  e->tokens = *out;
  size_t from = 0;
  if (adds_bos) {
    e->ends.push_back(0);  // the BOS the tokenizer added: no text
    from = 1;
  }
  if (Walk(model, text, e->tokens, from, 0, &e->ends)) {
    e->text = text;
    Insert(std::move(e));
  }
  return MZ_OK;
}

size_t PromptTokens::entries() const {
  std::lock_guard<std::mutex> l(mu_);
  return lru_.size();
}

void PromptTokens::Clear() {
  std::lock_guard<std::mutex> l(mu_);
  lru_.clear();
  bytes_ = 0;
}

}  // namespace mz::serve
