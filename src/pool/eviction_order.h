// The pool's eviction order, in one place: which conversation, shared chunk store and weights give
// back RAM first. A policy that plans (PlanEviction: pure, no locks, no clock, unit-tested in
// test_pool's EvictionOrder tests); the pool applies the plan (Pool::ApplyEviction in
// pool/pool_budget.cpp, the one place that moves memory for the budget, Evict and pressure).
//
// The order, for the pool's candidates (its open conversations, each in use or idle with its last
// use time):
//   1. idle conversations, least recently used first, each out whole (its KV chunks by the
//      hybrid-swap policy, its in-memory swap moved to storage, its borrowed shared chunks
//      detached): kConversationWhole;
//   2. conversations in use, least recently used first, each out whole too, but the most recently
//      used conversation of all (the last candidate) gives only what is still needed, after the
//      shared chunks nobody holds attached: kSharedChunks, kConversationPart, kDetachShared,
//      kSharedChunks;
//   3. the weights (backward-out, then the base unit), only while no conversation computes:
//      kWeights.
// The applier stops as soon as the bytes asked for are freed (before any step).
//
// What a budget pass spares (EvictionMode::budget): with two or more conversations in use (several
// streams mid-reply) it stops at the first of them (kStopSparedInUse: none is evicted, nor the
// weights they all read); and it does not cut the conversation in use, nor the weights, when an
// idle conversation was found busy during the pass (kStopIfIdleBusy: deferred until the busy one's
// persist ends). Evict and pressure (budget false) go through everything, skipping only what is
// computing (the applier sees kBusy).
//
// The shared budget (pool/shared_budget.h) orders pools against each other and calls each pool's
// plan with the modes below (idle_only + whole: a model nobody uses).
#pragma once
#include <cstdint>
#include <vector>

namespace mz {

// One open conversation as the planner sees it.
struct EvictCandidate {
  bool in_use = false;       // Conversation::InUse at the pass's start
  uint64_t last_use_ns = 0;  // its last use (Env clock)
};

struct EvictionMode {
  // A budget pass (the pool's memory budget after a call): spares conversations in use when two or
  // more are, and defers the conversation in use and the weights when an idle one was busy.
  bool budget = false;
  // Only the idle conversations: not the most recently used one, not the weights (room for the
  // load arena; the shared budget's step 1 with whole).
  bool idle_only = false;
  // With idle_only: every conversation not in use goes out whole, the most recent one too, and the
  // unattached shared chunks after them (a model nobody uses). Conversations in use are skipped.
  bool whole = false;
};

struct EvictStep {
  enum Kind {
    kConversationWhole,  // candidate `conv`: all its KV (a busy one is skipped, noted as idle busy)
    kConversationPart,   // candidate `conv`: only the bytes still needed
    kDetachShared,       // candidate `conv` lets its borrowed shared chunks go
    kSharedChunks,       // shared chunks nobody holds attached, to the store's storage
    kWeights,            // the weight units, only while no conversation computes
    kStopSparedInUse,    // stop: a budget pass reached the conversations in use (two or more)
    kStopIfIdleBusy,     // stop if an idle conversation was busy (a budget pass: deferred)
  };
  Kind kind;
  int conv = -1;  // index into the candidates (kConversation*, kDetachShared), else -1
  bool operator==(const EvictStep& o) const { return kind == o.kind && conv == o.conv; }
};

// The steps, in order, for these candidates. Pure: the same input gives the same plan.
std::vector<EvictStep> PlanEviction(const std::vector<EvictCandidate>& candidates, const EvictionMode& mode);

}  // namespace mz
