// Many users at once (runtime/batcher.h, the pool's shared forward pass): each conversation's
// logits in a batch against the same conversation computed alone (B = 1, 2, 4, 8; mixed lengths;
// KV partly compressed q8 read in place, borrowed shared prefix chunks, a conversation just
// restored), a prompt sliced among others' decodes, a sequence cancelled mid-batch, conversations
// joining and leaving with Evict running (TSan: label concurrency), the budget pass sparing
// every conversation mid-reply, and a step in one graph against the same step layer by layer (the
// way a step runs while a restore is pending).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "core/sync_point.h"
#include "pool/pool.h"
#include "runtime/batcher.h"
#include "runtime/context.h"
#include "runtime/forward.h"
#include "test_util.h"

#include "ggml-cpu.h"
#include "ggml.h"

namespace mz {
// Drops a weight unit the way a pool's table would (the model's units are unit state).
struct ModelTestPeer {
  static void DropUnit(Model& m, int u) { m.DropUnit(u); }
  static Status LoadUnit(Model& m, int u) { return m.LoadUnit(u); }
};
namespace {

constexpr int T = 64;  // chunk tokens (tiny model)

std::string ModelFile() { return test::ModelPath("tiny-qwen3", "q8_0"); }

std::unique_ptr<Model> LoadModel() {
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), ModelFile(), ModelOptions(), &m);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return m;
}

PoolOptions Opts(bool batch, const std::string& tag) {
  PoolOptions o;
  o.context.n_ctx = 1024;
  o.context.kv_chunk_tokens = T;
  o.context.kv_codec = "q8";  // compressed chunks are read in place by attention
  o.context.swap_path = test::TempDir() + "/batch-" + tag + "-" + std::to_string(getpid()) + ".swap";
  o.write_behind_idle_ms = 60000;
  o.batch = batch;
  return o;
}

std::vector<int32_t> Tokens(int sys, int n, int seed) {
  std::vector<int32_t> t = test::PromptTokens(ModelFile(), sys);
  std::mt19937 rng{uint32_t(seed)};
  while (int(t.size()) < n) t.push_back(int32_t(100 + rng() % 2000));
  t.resize(size_t(n));
  return t;
}

// KL(p || q) of the softmaxes of two logits rows, in double.
double Kl(const float* p, const float* q, int n) {
  auto lse = [n](const float* x) {
    double m = x[0];
    for (int i = 1; i < n; ++i) m = std::max(m, double(x[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
    return m + std::log(s);
  };
  const double lp = lse(p), lq = lse(q);
  double kl = 0;
  for (int i = 0; i < n; ++i) {
    const double a = double(p[i]) - lp, b = double(q[i]) - lq;
    kl += std::exp(a) * (a - b);
  }
  return kl;
}

// Greedy tokens agree wherever the reference's top-2 margin is clear (> 1e-3).
void ExpectSameChoice(const float* ref, const float* got, int n, const std::string& what) {
  int a = 0, b = -1;
  for (int i = 1; i < n; ++i)
    if (ref[i] > ref[a]) a = i;
  for (int i = 0; i < n; ++i)
    if (i != a && (b < 0 || ref[i] > ref[b])) b = i;
  int g = 0;
  for (int i = 1; i < n; ++i)
    if (got[i] > got[g]) g = i;
  if (ref[a] - ref[b] > 1e-3f) EXPECT_EQ(g, a) << what;
}

// The conversations of a case: mixed lengths; 1 and 2 start with the same 2-chunk system prompt
// (2 borrows it from 1); 3 is partly evicted (q8 chunks in memory, read in place, or on storage);
// 4 is evicted whole (restored by its next call).
struct Case {
  std::vector<std::vector<int32_t>> hist;
  std::vector<int32_t> next;  // the token each decodes in the batch
};

Case MakeCase(int b) {
  Case c;
  for (int i = 0; i < b; ++i) {
    const int len = 40 + 53 * i;
    c.hist.push_back(i == 1 || i == 2 ? Tokens(2 * T, 2 * T + 20 + 9 * i, 7 + i) : Tokens(0, len, 100 + i));
    c.next.push_back(int32_t(300 + 17 * i));
  }
  return c;
}

// Builds the case's conversations in pool, one call at a time (the same computation and the same
// evictions in every pool: the placement policy is deterministic).
void Build(Pool* pool, const Case& c, std::vector<std::shared_ptr<Conversation>>* convs) {
  for (size_t i = 0; i < c.hist.size(); ++i) {
    std::shared_ptr<Conversation> conv;
    ASSERT_TRUE(pool->OpenConversation("c" + std::to_string(i), &conv).ok());
    ASSERT_TRUE(conv->Decode(c.hist[i].data(), int(c.hist[i].size()), false).ok());
    convs->push_back(conv);
  }
  for (size_t i = 3; i < c.hist.size() && i <= 4; ++i) {
    Context* ctx = (*convs)[i]->context();
    uint64_t freed = 0;
    const uint64_t before = ctx->Report().kv_resident;
    const uint64_t want = i == 3 ? before / 2 : ~uint64_t(0);
    ASSERT_TRUE(ctx->EvictBytes(want, &freed, nullptr, EvictScope::kKvOnly).ok());
    // (freed counts RAM net of the in-memory swap's segment, which may exceed a tiny model's KV.)
    EXPECT_LT(ctx->Report().kv_resident, before) << "conversation " << i << " moved out of RAM";
  }
}

// Runs fn(i) for every i on its own thread while the pool's batcher is held, releases it once all
// are queued: they share the steps deterministically.
void Together(Pool* pool, int n, const std::function<void(int)>& fn) {
  Batcher* b = pool->batcher();
  ASSERT_NE(b, nullptr);
  b->Hold(true);
  const int before = b->active();
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i) th.emplace_back([&, i] { fn(i); });
  while (b->active() < before + n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  b->Hold(false);
  for (auto& t : th) t.join();
}

class BatchSizes : public ::testing::TestWithParam<int> {};

// Every conversation's next-token logits in one batched step against the same conversations
// (same history, same KV forms) computed one at a time without the batcher.
TEST_P(BatchSizes, EachConversationsLogitsMatchItComputedAlone) {
  const int B = GetParam();
  auto m = LoadModel();
  const int nv = int(m->hparams().n_vocab);
  const Case c = MakeCase(B);
  std::unique_ptr<Pool> alone, batched;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(false, "alone"), &alone).ok());
  ASSERT_TRUE(Pool::Open(m.get(), Opts(true, "batched"), &batched).ok());
  std::vector<std::shared_ptr<Conversation>> ca, cb;
  Build(alone.get(), c, &ca);
  Build(batched.get(), c, &cb);
  if (B >= 3) {
    ConversationReport r;
    ASSERT_TRUE(batched->Report("c2", &r).ok());
    EXPECT_EQ(r.shared_chunks, 2) << "c2 borrows c1's system prompt";
  }
  std::vector<std::vector<float>> ref(static_cast<size_t>(B));
  for (int i = 0; i < B; ++i) {
    ASSERT_TRUE(ca[size_t(i)]->Decode(&c.next[size_t(i)], 1, false).ok());
    ref[size_t(i)].assign(ca[size_t(i)]->logits(0), ca[size_t(i)]->logits(0) + nv);
  }
  const BatcherStats s0 = batched->batcher()->Stats();
  std::vector<Status> st(static_cast<size_t>(B));
  Together(batched.get(), B, [&](int i) { st[size_t(i)] = cb[size_t(i)]->Decode(&c.next[size_t(i)], 1, false); });
  const BatcherStats s1 = batched->batcher()->Stats();
  EXPECT_EQ(s1.steps - s0.steps, 1u) << "one step for every decode";
  EXPECT_EQ(s1.max_batch, B);
  double worst = 0;
  for (int i = 0; i < B; ++i) {
    ASSERT_TRUE(st[size_t(i)].ok()) << i << ": " << st[size_t(i)].ToString();
    ASSERT_EQ(cb[size_t(i)]->n_tokens(), int(c.hist[size_t(i)].size()) + 1);
    const float* got = cb[size_t(i)]->logits(0);
    ASSERT_NE(got, nullptr);
    const double kl = Kl(ref[size_t(i)].data(), got, nv);
    worst = std::max(worst, kl);
    EXPECT_LE(kl, 1e-4) << "conversation " << i;
    ExpectSameChoice(ref[size_t(i)].data(), got, nv, "conversation " + std::to_string(i));
    if (B == 1) EXPECT_EQ(std::memcmp(ref[0].data(), got, size_t(nv) * sizeof(float)), 0) << "B = 1 is the same pass";
  }
  std::printf("B=%d worst KL %.3g\n", B, worst);
}

INSTANTIATE_TEST_SUITE_P(Batch, BatchSizes, ::testing::Values(1, 2, 4, 8));

// A prompt arriving while three conversations decode is cut into prefill_slice slices: the first
// step holds the three decodes and one slice, the rest of the prompt follows; every result matches
// the same conversations computed alone.
TEST(Batch, PromptIsSlicedAmongOthersDecodes) {
  auto m = LoadModel();
  const int nv = int(m->hparams().n_vocab);
  const Case c = MakeCase(3);
  PoolOptions ob = Opts(true, "slice");
  ob.batch_prefill_slice = 32;
  ob.batch_itl_factor = 0;  // the fixed slice
  std::unique_ptr<Pool> alone, batched;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(false, "slice-alone"), &alone).ok());
  ASSERT_TRUE(Pool::Open(m.get(), ob, &batched).ok());
  std::vector<std::shared_ptr<Conversation>> ca, cb;
  Build(alone.get(), c, &ca);
  Build(batched.get(), c, &cb);
  const std::vector<int32_t> prompt = Tokens(0, 150, 55);
  std::shared_ptr<Conversation> pa, pb;
  ASSERT_TRUE(alone->OpenConversation("p", &pa).ok());
  ASSERT_TRUE(batched->OpenConversation("p", &pb).ok());
  ASSERT_TRUE(pa->Decode(prompt.data(), 150, false).ok());
  std::vector<float> pref(pa->logits(0), pa->logits(0) + nv);
  const BatcherStats s0 = batched->batcher()->Stats();
  Status pst;
  std::vector<Status> st(3);
  Together(batched.get(), 4, [&](int i) {
    if (i == 3) pst = pb->Decode(prompt.data(), 150, false);
    else st[size_t(i)] = cb[size_t(i)]->Decode(&c.next[size_t(i)], 1, false);
  });
  const BatcherStats s1 = batched->batcher()->Stats();
  ASSERT_TRUE(pst.ok()) << pst.ToString();
  // 3 decodes + 32 prompt tokens, then 118 more in one step with nobody decoding.
  EXPECT_EQ(s1.steps - s0.steps, 2u);
  EXPECT_EQ(s1.max_batch, 4);
  EXPECT_EQ(s1.prefill_tokens - s0.prefill_tokens, 149u);
  EXPECT_LE(Kl(pref.data(), pb->logits(0), nv), 1e-4);
  ExpectSameChoice(pref.data(), pb->logits(0), nv, "the sliced prompt");
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(st[size_t(i)].ok());
    ASSERT_TRUE(ca[size_t(i)]->Decode(&c.next[size_t(i)], 1, false).ok());
    EXPECT_LE(Kl(ca[size_t(i)]->logits(0), cb[size_t(i)]->logits(0), nv), 1e-4) << i;
  }
}

// A sequence cancelled after its first slice returns kCancelled with its conversation as before
// the call; the others in the batch finish with the right logits, and the cancelled one computes
// correctly afterwards.
TEST(Batch, CancelledSequenceLeavesTheOthersUndisturbed) {
  auto m = LoadModel();
  const int nv = int(m->hparams().n_vocab);
  const Case c = MakeCase(3);
  PoolOptions ob = Opts(true, "cancel");
  ob.batch_prefill_slice = 16;
  ob.batch_itl_factor = 0;
  std::unique_ptr<Pool> alone, batched;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(false, "cancel-alone"), &alone).ok());
  ASSERT_TRUE(Pool::Open(m.get(), ob, &batched).ok());
  std::vector<std::shared_ptr<Conversation>> ca, cb;
  Build(alone.get(), c, &ca);
  Build(batched.get(), c, &cb);
  const std::vector<int32_t> prompt = Tokens(0, 200, 77);
  const int held = cb[0]->n_tokens();
  // Conversation 0 gets a long prompt; 1 and 2 decode. After the first step, 0 is cancelled.
  std::atomic<int> steps{0};
  SyncPoints::SetCallback("batcher:step_done", [&](int) {
    if (steps.fetch_add(1) == 0) cb[0]->Cancel();
  });
  Status s0;
  std::vector<Status> st(3);
  Together(batched.get(), 3, [&](int i) {
    if (i == 0) s0 = cb[0]->Decode(prompt.data(), 200, false);
    else st[size_t(i)] = cb[size_t(i)]->Decode(&c.next[size_t(i)], 1, false);
  });
  SyncPoints::ClearAll();
  EXPECT_EQ(s0.code(), Status::kCancelled) << s0.ToString();
  EXPECT_EQ(cb[0]->n_tokens(), held);
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(st[size_t(i)].ok()) << st[size_t(i)].ToString();
    ASSERT_TRUE(ca[size_t(i)]->Decode(&c.next[size_t(i)], 1, false).ok());
    EXPECT_LE(Kl(ca[size_t(i)]->logits(0), cb[size_t(i)]->logits(0), nv), 1e-4) << i;
  }
  EXPECT_EQ(batched->batcher()->Stats().cancelled, 1u);
  // The cancelled conversation's KV was cut back cleanly: its next call is right.
  ASSERT_TRUE(cb[0]->Decode(&c.next[0], 1, false).ok());
  ASSERT_TRUE(ca[0]->Decode(&c.next[0], 1, false).ok());
  EXPECT_LE(Kl(ca[0]->logits(0), cb[0]->logits(0), nv), 1e-4);
}

// Conversations join and leave (opened, closed, deleted) while others generate in batches, with
// Evict and pressure-sized evictions running meanwhile: every call succeeds and every history is
// what its thread fed (TSan runs this: label concurrency).
TEST(Batch, JoinLeaveAndEvictWhileBatchesRun) {
  auto m = LoadModel();
  std::unique_ptr<Pool> pool;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(true, "churn"), &pool).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> th;
  for (int w = 0; w < 3; ++w)
    th.emplace_back([&, w] {
      for (int round = 0; round < 3; ++round) {
        const std::string id = "w" + std::to_string(w) + "-" + std::to_string(round);
        std::shared_ptr<Conversation> c;
        if (!pool->OpenConversation(id, &c).ok()) {
          failures++;
          continue;
        }
        const auto t = Tokens(0, 30 + 10 * w, 900 + w * 10 + round);
        if (!c->Decode(t.data(), int(t.size()), false).ok()) failures++;
        for (int k = 0; k < 6; ++k) {
          const int32_t tok = int32_t(200 + k + w);
          Status st = c->Decode(&tok, 1, false);
          if (!st.ok()) {
            failures++;
            ADD_FAILURE() << id << ": " << st.ToString();
          }
        }
        if (c->n_tokens() != int(t.size()) + 6) failures++;
        (void)c->Commit();
        if (round % 2 == 0) (void)pool->Close(id);
        else (void)pool->Delete(id);
      }
    });
  std::thread evictor([&] {
    while (!stop.load()) {
      uint64_t f = 0;
      (void)pool->Evict(uint64_t(1) << 20, &f);
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
  });
  for (auto& t : th) t.join();
  stop = true;
  evictor.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pool->batcher()->active(), 0);
}

// A conversation that returns while another generates through the shared pass restores beside
// its steps (context.cpp, "others are generating"): with restore_nice_beside_batch (default +10)
// every unit is restored on one thread other than the caller, at the caller's nice + 10; its logits
// equal those of the same conversation never evicted. With 0: on the caller's thread at its nice.
TEST(Batch, ReturnBesideTheStepsRestoresBelowTheirPriority) {
  auto m = LoadModel();
  const auto hist = Tokens(0, 3 * T + 11, 4242);
  const auto other = Tokens(0, 50, 4343);
  const int32_t next[2] = {321, 654};
  // Reference: the same history, never evicted, computed alone.
  std::vector<float> ref;
  {
    std::unique_ptr<Pool> pool;
    ASSERT_TRUE(Pool::Open(m.get(), Opts(false, "beside-ref"), &pool).ok());
    std::shared_ptr<Conversation> c;
    ASSERT_TRUE(pool->OpenConversation("r", &c).ok());
    ASSERT_TRUE(c->Decode(hist.data(), int(hist.size()), false).ok());
    ASSERT_TRUE(c->Decode(next, 2, false).ok());
    ref.assign(c->logits(0), c->logits(0) + m->hparams().n_vocab);
  }
  for (int nice : {10, 0}) {
    SCOPED_TRACE("restore_nice_beside_batch " + std::to_string(nice));
    PoolOptions o = Opts(true, "beside-" + std::to_string(nice));
    o.context.restore_nice_beside_batch = nice;
    o.context.kv_codec = "none";  // evicted chunks are restored (none is read in place)
    std::unique_ptr<Pool> pool;
    ASSERT_TRUE(Pool::Open(m.get(), o, &pool).ok());
    std::shared_ptr<Conversation> ret, gen;
    ASSERT_TRUE(pool->OpenConversation("ret", &ret).ok());
    ASSERT_TRUE(ret->Decode(hist.data(), int(hist.size()), false).ok());
    uint64_t freed = 0;
    ASSERT_TRUE(ret->context()->EvictBytes(~uint64_t(0), &freed, nullptr, EvictScope::kKvOnly).ok());
    ASSERT_EQ(ret->context()->Report().kv_resident, 0u);
    ASSERT_TRUE(pool->OpenConversation("gen", &gen).ok());
    ASSERT_TRUE(gen->Decode(other.data(), int(other.size()), false).ok());
    // The other conversation's request is queued in the held batcher: it is generating.
    Batcher* b = pool->batcher();
    b->Hold(true);
    std::thread g([&] {
      const int32_t t = 77;
      EXPECT_TRUE(gen->Decode(&t, 1, false).ok());
    });
    while (b->active() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const pid_t caller = pid_t(gettid());
    const int caller_nice = Env::Default()->ThreadNice();
    std::atomic<int> units{0}, on_caller{0}, wrong_nice{0};
    SyncPoints::SetCallback("restore:unit", [&](int) {
      units++;
      if (pid_t(gettid()) == caller) on_caller++;
      if (Env::Default()->ThreadNice() != std::min(19, caller_nice + nice)) wrong_nice++;
    });
    // Released once the returning call has queued too (after its restore).
    std::thread release([&] {
      while (b->active() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      b->Hold(false);
    });
    Status st = ret->RestoreGenerate(next, 2, PipelineOptions(), nullptr);
    release.join();
    g.join();
    SyncPoints::ClearAll();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_GT(units.load(), 0) << "the KV was restored by the executor";
    EXPECT_EQ(wrong_nice.load(), 0);
    if (nice > 0) EXPECT_EQ(on_caller.load(), 0) << "restored on its own thread";
    else EXPECT_GT(on_caller.load(), 0) << "the caller's thread takes part";
    const float* got = ret->logits(0);
    ASSERT_NE(got, nullptr);
    EXPECT_LE(Kl(ref.data(), got, m->hparams().n_vocab), 1e-4);
    ExpectSameChoice(ref.data(), got, m->hparams().n_vocab, "the returned conversation");
  }
}

// With three conversations mid-reply under a budget below their KV, the budget pass (once per
// step) evicts the idle conversation and none of the three: each keeps its KV resident between its
// tokens. Once their turns end (Commit), a pass takes them as usual. (Before 0.13 the pass spared
// only the most recently used conversation: with the rule off this test fails at the first token.)
TEST(Batch, BudgetPassNeverEvictsAConversationMidReply) {
  auto m = LoadModel();
  PoolOptions o = Opts(true, "inuse");
  o.load_arena_bytes = 0;
  std::shared_ptr<Conversation> idle;
  std::vector<std::shared_ptr<Conversation>> live(3);
  std::unique_ptr<Pool> pool;
  // An idle conversation whose turn ended, and three mid-reply (prompt computed, no Commit).
  auto setup = [&] {
    ASSERT_TRUE(Pool::Open(m.get(), o, &pool).ok());
    ASSERT_TRUE(pool->OpenConversation("idle", &idle).ok());
    const auto ti = Tokens(0, 150, 50);
    ASSERT_TRUE(idle->Decode(ti.data(), 150, false).ok());
    ASSERT_TRUE(idle->Commit().ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pool->OpenConversation("live" + std::to_string(i), &live[size_t(i)]).ok());
      const auto t = Tokens(0, 150, 60 + i);
      // A turn's prompt (restore_generate, as the server sends it) opens the turn.
      ASSERT_TRUE(live[size_t(i)]->RestoreGenerate(t.data(), 150, PipelineOptions(), nullptr).ok());
    }
  };
  // Without a budget: what the four hold (weights, KV, the batcher's buffers).
  setup();
  const uint64_t all = pool->Stats().in_memory;
  std::printf("compute buffers %.2f MiB, weights %.2f MiB\n", double(pool->Stats().batch.compute_buffer_bytes) / 1048576,
              double(pool->Stats().weights_total) / 1048576);
  ConversationReport r0;
  ASSERT_TRUE(pool->Report("live0", &r0).ok());
  const uint64_t one = r0.kv_resident;
  ASSERT_GT(one, 0u);
  idle.reset();
  for (auto& c : live) c.reset();
  pool.reset();
  // A budget one and a half conversations short: the idle one is not enough.
  o.memory_budget = all - one - one / 2;
  setup();
  // Interleaved tokens, as three streams: after every call, no live conversation lost KV.
  for (int k = 0; k < 8; ++k)
    for (int i = 0; i < 3; ++i) {
      const int32_t tok = int32_t(400 + k);
      ASSERT_TRUE(live[size_t(i)]->Decode(&tok, 1, false).ok());
      for (int j = 0; j < 3; ++j) {
        ConversationReport r;
        ASSERT_TRUE(pool->Report("live" + std::to_string(j), &r).ok());
        EXPECT_EQ(r.kv_mem_compressed + r.kv_storage, 0u) << "live" << j << " evicted mid-reply (token " << k << ")";
      }
    }
  ConversationReport ri;
  ASSERT_TRUE(pool->Report("idle", &ri).ok());
  EXPECT_EQ(ri.kv_resident, 0u) << "the idle conversation goes first";
  PoolStats s = pool->Stats();
  EXPECT_EQ(s.in_use, 3);
  EXPECT_GT(s.budget_spared_in_use, 0u);
  // Turns end: the next pass may take them (the budget holds again).
  for (auto& c : live) ASSERT_TRUE(c->Commit().ok());
  const int32_t tok = 7;
  ASSERT_TRUE(live[0]->Decode(&tok, 1, false).ok());
  s = pool->Stats();
  EXPECT_LE(s.in_use, 1);
  EXPECT_LE(s.in_memory, o.memory_budget + (uint64_t(1) << 20));
}

// The write-behind saves a changed conversation once no call has run on it for
// write_behind_idle_ms. A call waiting in the batcher (a decode behind a long prompt step: seconds
// at 8 streams on 2 cores) is mid-reply, not idle: before session 37 the idle scan queued it, waited
// for its lock and saved it the moment the call returned, holding the lock while the caller came
// back for its next token (and taking CPU from the steps), after every step longer than the idle
// time. Now it is saved only once idle_ms have passed with no call on it.
TEST(Batch, WriteBehindNeverSavesAConversationMidCall) {
  auto m = LoadModel();
  PoolOptions o = Opts(true, "wbmid");
  o.dir = test::TempDir() + "/batch-wbmid-" + std::to_string(getpid());
  std::filesystem::remove_all(o.dir);
  std::filesystem::create_directories(o.dir);
  o.write_behind_idle_ms = 1000;
  std::unique_ptr<Pool> pool;
  ASSERT_TRUE(Pool::Open(m.get(), o, &pool).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(pool->OpenConversation("w", &c).ok());
  const auto t = Tokens(0, 100, 11);
  ASSERT_TRUE(c->RestoreGenerate(t.data(), 100, PipelineOptions(), nullptr).ok());  // changed, not saved
  // Its next token waits in the held batcher for 2.5 s: longer than the idle time, with a change
  // not yet saved.
  Batcher* b = pool->batcher();
  ASSERT_NE(b, nullptr);
  b->Hold(true);
  Status st;
  std::thread th([&] {
    const int32_t tok = 321;
    st = c->Decode(&tok, 1, false);
  });
  while (b->active() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(pool->Stats().persists, 0u);
  b->Hold(false);
  th.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The call just ended: the conversation is in use (its caller samples), not saved now.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(pool->Stats().persists, 0u) << "saved right after a call returned: mid-reply";
  // Idle for write_behind_idle_ms: saved (nothing lost).
  for (int w = 0; w < 20000 && pool->Stats().persists == 0; w += 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pool->Stats().persists, 1u);
  c.reset();
  pool.reset();
  std::filesystem::remove_all(o.dir);
}

// A pooled context computes through the pool's batcher: it never makes a Forward of its own (its
// backend and graph metadata), which is made only at a context's first own compute (issue 44's
// design items). The saving per conversation is recorded (fixed_bytes, construction time; a
// figure, not asserted on time).
TEST(Batch, PooledContextsMakeNoForwardOfTheirOwn) {
  auto m = LoadModel();
  for (bool batch : {true, false}) {
    std::unique_ptr<Pool> pool;
    ASSERT_TRUE(Pool::Open(m.get(), Opts(batch, batch ? "lazy" : "lazy-alone"), &pool).ok());
    std::vector<std::shared_ptr<Conversation>> cs(3);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(pool->OpenConversation("c" + std::to_string(i), &cs[size_t(i)]).ok());
      EXPECT_FALSE(cs[size_t(i)]->context()->has_own_forward()) << "none made at open";
      const std::vector<int32_t> t = Tokens(0, 40 + 8 * i, i);
      ASSERT_TRUE(cs[size_t(i)]->Decode(t.data(), int(t.size()), false).ok());
      const int32_t next = 7;
      ASSERT_TRUE(cs[size_t(i)]->Decode(&next, 1, false).ok());
      EXPECT_EQ(cs[size_t(i)]->context()->has_own_forward(), !batch)
          << (batch ? "a batched conversation computed on a Forward of its own"
                    : "the ablation (no batcher) computes on its own Forward");
    }
  }
  ForwardOptions fo;
  const uint64_t t0 = Env::Default()->NowNs();
  Forward f(m.get(), nullptr, fo);
  const uint64_t ns = Env::Default()->NowNs() - t0;
  EXPECT_GT(f.fixed_bytes(), 0u);
  RecordProperty("forward_fixed_bytes", std::to_string(f.fixed_bytes()));
  RecordProperty("forward_construct_us", std::to_string(ns / 1000));
  std::printf("a Forward not made per pooled context: %llu bytes of graph metadata, %.1f us to make (loaded machine)\n",
              static_cast<unsigned long long>(f.fixed_bytes()), double(ns) / 1000.0);
}

// --- One graph per step, or layer by layer (runtime/forward.h) ---

// Caches of the tiny model, T-token chunks, f16 or q8 rows.
std::vector<std::unique_ptr<KvCache>> Caches(const Model& m, int n, KvType type) {
  KvGeometry g;
  g.n_layer = int(m.hparams().n_layer);
  g.n_kv_head = int(m.hparams().n_head_kv);
  g.head_dim = int(m.hparams().head_dim);
  g.chunk_tokens = T;
  g.kv_type = type;
  std::vector<std::unique_ptr<KvCache>> v;
  for (int i = 0; i < n; ++i) v.push_back(std::make_unique<KvCache>(Env::Default(), g, 1024));
  return v;
}

// One Step over three sequences of mixed lengths on fwd; units[] records the wait hook's calls.
struct StepRun {
  Forward* fwd;
  std::vector<std::unique_ptr<KvCache>>* kv;
  std::vector<std::vector<float>> logits = std::vector<std::vector<float>>(3);
  Status Run(const std::vector<std::vector<int32_t>>& toks, const std::vector<int>& n_logits) {
    std::vector<Forward::Seq> seqs(3);
    for (size_t i = 0; i < 3; ++i) {
      KvCache* c = (*kv)[i].get();
      Status st = c->Reserve(c->n_tokens() + int(toks[i].size()));
      if (!st.ok()) return st;
      logits[i].clear();
      seqs[i] = Forward::Seq{c, toks[i].data(), int(toks[i].size()), n_logits[i], &logits[i]};
    }
    return fwd->Step(seqs.data(), 3);
  }
};

// The KV store's fp16 rounding (Forward's store op) is ggml-cpu's ggml_cpu_fp32_to_fp16 since
// session 37 (the CPU's F16C conversion where built with it), which must give the same bits as
// ggml's scalar ggml_fp32_to_fp16_row it replaced: every fp16 value, the halfway points between
// neighbours (ties to even), and random floats, including subnormals and the overflow edge.
TEST(KvStoreRounding, GgmlCpuConversionEqualsTheScalarRow) {
  std::vector<float> x;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = ggml_fp16_to_fp32(ggml_fp16_t(h));
    if (std::isnan(f)) continue;
    x.push_back(f);
    const float g = ggml_fp16_to_fp32(ggml_fp16_t(h + 1));
    if (h + 1 < 0x10000u && std::isfinite(f) && std::isfinite(g) && !std::isnan(g)) x.push_back(f + (g - f) / 2);
  }
  std::mt19937 rng(37);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) x.push_back(f);
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, -65520.0f, 1e-8f, 5.9604644775390625e-8f, 2.98e-8f, 0.0f, -0.0f})
    x.push_back(f);
  // Odd lengths and offsets: the vector loops and their scalar tails.
  std::vector<ggml_fp16_t> a(x.size()), b(x.size());
  for (size_t at = 0; at < x.size();) {
    const size_t n = std::min<size_t>(x.size() - at, 1 + (at * 7) % 131);
    ggml_cpu_fp32_to_fp16(x.data() + at, a.data() + at, int64_t(n));
    ggml_fp32_to_fp16_row(x.data() + at, b.data() + at, int64_t(n));
    at += n;
  }
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(a[i], b[i]) << "value " << x[i] << " (index " << i << ")";
}

// The same steps computed as one graph (no wait hook) and layer by layer (a wait hook that lets
// every unit through, as the restore pipeline's does once a unit is in): the logits are equal bit
// for bit at every step, with prompts of mixed lengths (all logits, the last row, none), decodes
// over the KV each way stored, and f16 and q8 KV rows. Also: the one-graph step computes one graph,
// the other n_layer + 2 with the hook called before each (base, layers in order, base).
TEST(ForwardGraphs, OneGraphStepEqualsLayerByLayer) {
  auto m = LoadModel();
  const int L = int(m->hparams().n_layer);
  const size_t nv = m->hparams().n_vocab;
  ForwardOptions fo;
  for (KvType type : {KvType::kF16, KvType::kQ8}) {
    SCOPED_TRACE(type == KvType::kQ8 ? "q8 KV" : "f16 KV");
    auto kv_one = Caches(*m, 3, type), kv_layered = Caches(*m, 3, type);
    Forward one(m.get(), nullptr, fo), layered(m.get(), nullptr, fo);
    ASSERT_TRUE(one.whole_step_fits());
    std::vector<int> units;
    layered.set_wait([&](int u) {
      units.push_back(u);
      return Status::Ok();
    });
    StepRun a{&one, &kv_one}, b{&layered, &kv_layered};
    // Prompts (70 tokens: every row; 130: the last; 20: none), then two decode steps, one of them
    // with no logits at all, then one more decode.
    const std::vector<std::vector<std::vector<int32_t>>> steps = {
        {Tokens(0, 70, 1), Tokens(0, 130, 2), Tokens(0, 20, 3)}, {{11}, {12}, {13}}, {{21}, {22}, {23}}, {{31}, {32}, {33}}};
    const std::vector<std::vector<int>> rows = {{70, 1, 0}, {1, 1, 1}, {0, 0, 0}, {1, 1, 1}};
    for (size_t k = 0; k < steps.size(); ++k) {
      SCOPED_TRACE("step " + std::to_string(k));
      units.clear();
      ASSERT_TRUE(a.Run(steps[k], rows[k]).ok());
      ASSERT_TRUE(b.Run(steps[k], rows[k]).ok());
      const bool head = rows[k][0] + rows[k][1] + rows[k][2] > 0;
      EXPECT_EQ(one.timing().graphs, 1) << "no restore pending: one graph";
      EXPECT_EQ(layered.timing().graphs, L + 1 + (head ? 1 : 0)) << "a wait hook: a graph per layer";
      std::vector<int> want = {m->base_unit()};
      for (int l = 0; l < L; ++l) want.push_back(l);
      if (head) want.push_back(m->base_unit());
      EXPECT_EQ(units, want) << "the hook is asked before each graph, front layers first";
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_EQ(kv_one[i]->n_tokens(), kv_layered[i]->n_tokens());
        ASSERT_EQ(a.logits[i].size(), size_t(rows[k][i]) * nv) << "sequence " << i;
        ASSERT_EQ(b.logits[i].size(), a.logits[i].size()) << "sequence " << i;
        if (!a.logits[i].empty())  // (memcmp of no rows: null pointers, which UBSan rejects)
          EXPECT_EQ(std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)), 0)
              << "sequence " << i << ": the two ways differ";
      }
    }
  }
}

// A one-graph step checks every unit before computing anything: a dropped layer unit fails the
// step with kBusy, nothing computed (no graph), every sequence's KV length as before; with the unit
// back the same step succeeds.
TEST(ForwardGraphs, OneGraphStepChecksEveryUnitFirst) {
  auto m = LoadModel();
  const int L = int(m->hparams().n_layer);
  ASSERT_GE(L, 2);
  auto kv = Caches(*m, 3, KvType::kF16);
  Forward f(m.get(), nullptr, ForwardOptions());
  StepRun r{&f, &kv};
  ASSERT_TRUE(r.Run({Tokens(0, 30, 1), Tokens(0, 40, 2), Tokens(0, 50, 3)}, {1, 1, 1}).ok());
  ModelTestPeer::DropUnit(*m, L - 1);
  Status st = r.Run({{5}, {6}, {7}}, {1, 1, 1});
  EXPECT_EQ(st.code(), Status::kBusy) << st.ToString();
  EXPECT_EQ(f.timing().graphs, 0) << "nothing computed before the missing unit was found";
  EXPECT_EQ(kv[0]->n_tokens(), 30);
  EXPECT_EQ(kv[1]->n_tokens(), 40);
  EXPECT_EQ(kv[2]->n_tokens(), 50);
  ASSERT_TRUE(ModelTestPeer::LoadUnit(*m, L - 1).ok());
  ASSERT_TRUE(r.Run({{5}, {6}, {7}}, {1, 1, 1}).ok());
  EXPECT_EQ(f.timing().graphs, 1);
}

// A request still restoring (Request::restoring, a wait hook) runs alone, layer by layer, its hook
// asked before each layer; the decodes queued beside it run in the next step, as one graph. Each
// gets the logits it has computed without the batcher (the restoring one bit for bit: it ran
// alone; the others within the batch tolerance, KL <= 1e-4 and the same greedy choice).
TEST(ForwardGraphs, RestorePendingMidBatchTakesTheLayerPath) {
  auto m = LoadModel();
  const int L = int(m->hparams().n_layer);
  const size_t nv = m->hparams().n_vocab;
  // References: each sequence alone on a Forward of its own.
  auto kv_ref = Caches(*m, 3, KvType::kF16);
  auto kv = Caches(*m, 3, KvType::kF16);
  const std::vector<std::vector<int32_t>> hist = {Tokens(0, 90, 1), Tokens(0, 60, 2), Tokens(0, 75, 3)};
  Forward ref(m.get(), nullptr, ForwardOptions());
  std::vector<std::vector<float>> want(3);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(kv_ref[i]->Reserve(int(hist[i].size()) + 1).ok());
    ASSERT_TRUE(kv[i]->Reserve(int(hist[i].size())).ok());
    Forward::Seq s{kv_ref[i].get(), hist[i].data(), int(hist[i].size()), 0, nullptr};
    ASSERT_TRUE(ref.Step(&s, 1).ok());
    Forward::Seq h{kv[i].get(), hist[i].data(), int(hist[i].size()), 0, nullptr};
    ASSERT_TRUE(ref.Step(&h, 1).ok());
    const int32_t next = int32_t(400 + i);
    Forward::Seq d{kv_ref[i].get(), &next, 1, 1, &want[i]};
    ASSERT_TRUE(ref.Step(&d, 1).ok());
  }
  std::shared_ptr<Batcher> b;
  ASSERT_TRUE(Batcher::Create(m.get(), BatcherOptions(), &b).ok());
  std::atomic<bool> restored{false};
  std::vector<int> units;  // the batcher's thread only, read after the request returned
  std::vector<Batcher::Request> rq(3);
  std::vector<std::vector<float>> got(3);
  std::vector<int32_t> next = {400, 401, 402};
  for (size_t i = 0; i < 3; ++i) {
    rq[i].kv = kv[i].get();
    rq[i].tokens = &next[i];
    rq[i].n = 1;
    rq[i].logits = &got[i];
  }
  rq[0].restoring = [&] { return !restored.load(); };
  rq[0].wait = [&](int u) {
    if (!restored.load()) units.push_back(u);
    if (u == m->base_unit() && units.size() > 1) restored = true;  // the head: everything is in
    return Status::Ok();
  };
  b->Hold(true);
  std::vector<Status> st(3);
  std::vector<std::thread> th;
  for (size_t i = 0; i < 3; ++i) {
    th.emplace_back([&, i] { st[i] = b->Run(&rq[i]); });
    while (b->active() < int(i) + 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const BatcherStats s0 = b->Stats();
  b->Hold(false);
  for (auto& t : th) t.join();
  const BatcherStats s1 = b->Stats();
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(st[i].ok()) << i << ": " << st[i].ToString();
    ASSERT_EQ(got[i].size(), nv);
    // The restoring request computed alone, as its reference: bit for bit. The two others in one
    // step of two (the matrix products' kernels may sum a column of two in another order): the
    // batch tolerance.
    if (i == 0) EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), nv * sizeof(float)), 0);
    EXPECT_LE(Kl(want[i].data(), got[i].data(), int(nv)), 1e-4) << "sequence " << i;
    ExpectSameChoice(want[i].data(), got[i].data(), int(nv), "sequence " + std::to_string(i));
  }
  EXPECT_EQ(s1.steps - s0.steps, 2u) << "the restoring request alone, then the two others together";
  EXPECT_EQ(s1.layered_steps - s0.layered_steps, 1u) << "only the restoring request's step is layer by layer";
  std::vector<int> order = {m->base_unit()};
  for (int l = 0; l < L; ++l) order.push_back(l);
  order.push_back(m->base_unit());
  EXPECT_EQ(units, order) << "its hook before each graph, front layers first";
}

}  // namespace
}  // namespace mz
