// Forward: the transformer forward pass on ggml, a whole ubatch in one graph, or layer by layer
// while a restore is in flight.
//
// With no `wait` hook set (nothing restoring), a ubatch is ONE graph: embedding, every layer, the
// head, computed by one ggml_backend_graph_compute (one fork/join of the compute threads). Every
// unit it needs (base and each layer's weights, each layer's KV chunks) is checked before anything
// is computed: kBusy with the KV cache untouched when one is not in memory.
// With a `wait` hook (RestoreGenerate: the restore pipeline), a ubatch runs as an embedding graph
// (needs the base unit), one graph per layer (needs weight unit l and the KV chunks of layer l),
// then a head graph (base unit). Before each of these the hook is called with the unit index it
// needs (layer l, or base_unit() for the embedding/head); the hook may block until that unit is
// resident (the restoration pipeline) or fail, which aborts the pass with the KV cache untouched
// beyond the layers already computed (the caller truncates it back). Both ways compute the same
// ops on the same values in the same order: their logits and KV are bit-equal
// (ForwardGraphs.* in tests/test_batch.cpp).
//
// Per-layer graph (shapes in ggml order, n = tokens in the ubatch):
//   x[E,n] -> rms_norm*attn_norm -> q=Wq.x[+bq] [D,H,n], k=Wk.x[+bk] [D,Hkv,n], v=Wv.x[+bv] [D,Hkv,n]
//   -> (qwen3) rms_norm(q)*q_norm, rms_norm(k)*k_norm -> rope(q), rope(k)
//   -> kv_store(k, v) into chunks at positions pos0..pos0+n-1 (custom op)
//   -> attention over the chunk pointers (custom op, src/kernels/attention.h) [D,H,n]
//   -> Wo -> +x -> rms_norm*ffn_norm -> down(silu(gate) * up) -> +  -> x (written back in place)
//
// Several sequences in one pass (Step): the tokens of every sequence are the columns of one ubatch;
// the matrix products run once over all of them, the KV store and attention run per sequence over
// its own cache (each KvCache may hold chunks resident f16, q8 rows, or q8 read in place), and
// each sequence gets its own logits rows. Positions are per token, so sequences at different
// lengths mix freely (src/runtime/batcher.h schedules them).
//
// Thread-safety: one Forward is used by one thread at a time (a context's, or a pool's batcher);
// not safe for concurrent use.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "core/status.h"
#include "memory/kv_cache.h"
#include "model/model.h"

struct ggml_backend;
struct ggml_gallocr;
struct ggml_cgraph;
struct ggml_context;
struct ggml_tensor;
struct ggml_threadpool;

namespace mz {

struct ForwardOptions {
  int n_threads = 2;
  int n_ubatch = 512;
};

// Of the last Decode or Step. A whole-graph ubatch counts all its time in layers_s.
struct LayerTiming {
  double embed_s = 0, layers_s = 0, head_s = 0, wait_s = 0;
  int graphs = 0;  // ggml graphs computed: 1 per ubatch in one graph, n_layer + 2 layer by layer
};

class Forward {
 public:
  // kv: the cache Decode appends to (nullptr for a pass that only runs Steps, which name theirs).
  Forward(Model* model, KvCache* kv, const ForwardOptions& opts);
  ~Forward();
  Forward(const Forward&) = delete;
  Forward& operator=(const Forward&) = delete;

  using WaitFn = std::function<Status(int unit)>;
  void set_wait(WaitFn fn) { wait_ = std::move(fn); }
  // Temporarily computes on n threads (RestoreGenerate lends a core to restoration): clamped to
  // [1, threads set by SetThreads]; the CPUs stay those SetThreads chose.
  void set_n_threads(int n);
  int n_threads() const { return opts_.n_threads; }

  // Changes the compute threads to n and their CPUs to the first n of `cpus` (empty: not pinned).
  // Pinned, each ggml compute thread is bound to one of those CPUs (a ggml threadpool with a strict
  // cpumask; one thread: the calling thread, through Env::SetThreadAffinity, during Decode). The
  // calling thread of Decode runs one of the compute threads, so its affinity is saved before each
  // Decode and put back after (Env::Get/SetThreadAffinity), whatever happened. Once pinned, the
  // ggml (OpenMP) worker threads keep an affinity until told otherwise: unpinning gives them the
  // CPUs the caller may use (its affinity now), not "whatever they had".
  // Limitation: OpenMP's workers belong to the calling thread, not to this Forward. A Forward that
  // was never pinned applies no mask, so run on the same thread after a pinned one it computes on
  // workers still pinned to the other's CPUs (one context per thread, or pin both, avoids it).
  // kInvalidArgument: n outside [1, 512], fewer CPUs than n, a repeated id or one the calling
  // thread may not run on (Env::GetThreadAffinity); kNoMemory: ggml could not make the threadpool.
  // On any failure nothing changed. REQUIRES: no Decode in flight (the Context's lock).
  Status SetThreads(int n, const std::vector<int>& cpus);
  // CPUs the compute threads are pinned to (empty: not pinned).
  const std::vector<int>& cpus() const { return cpus_; }

  // Appends tokens at positions [kv->n_tokens(), +n). On success the KV cache holds them and
  // *logits holds n_vocab floats per output row: every token's row if all_logits, else only the last
  // token's. On failure the KV cache is truncated back to its previous length (no torn state).
  Status Decode(const int32_t* tokens, int n, bool all_logits, std::vector<float>* logits);

  // One sequence's part of a Step. kv must have chunks reserved for positions
  // [kv->n_tokens(), kv->n_tokens() + n) (KvCache::Reserve); those are written, and on success
  // kv->n_tokens() grows by n. n_logits: rows appended to *logits (n_vocab floats each): 0 (none),
  // 1 (the last token's) or n (every token's).
  struct Seq {
    KvCache* kv = nullptr;
    const int32_t* tokens = nullptr;
    int n = 0;
    int n_logits = 0;
    std::vector<float>* logits = nullptr;
  };
  // One pass over several sequences (distinct KvCaches), every token at once: sum of n at most
  // n_ubatch (kInvalidArgument otherwise; no KV touched). On failure every sequence's KV cache is
  // truncated back to its length before the call and its logits are left as they were. kBusy when
  // a unit the step needs is not in memory (after the wait hook), as Decode.
  Status Step(Seq* seqs, int n_seqs);
  // Bytes of the compute buffers allocated so far (they grow to the largest graph computed).
  uint64_t compute_buffer_bytes() const;
  // Host bytes this Forward holds beyond its compute buffers: the graph metadata buffer, made at
  // construction (what a context that never computes on its own saves: Context::forward).
  uint64_t fixed_bytes() const { return meta_buf_.size(); }
  // Frees the compute buffers; the next graph allocates them again (growing as before, a
  // reallocation per larger graph). Returns the bytes freed. REQUIRES: nothing computes on this
  // Forward meanwhile (its owner's lock).
  uint64_t ReleaseComputeBuffers();
  // Sizes the compute buffers for a step of n_tokens tokens with n_out logits rows now, computed
  // either way (its layer-by-layer graphs and, when it fits, its one graph; they still grow if a
  // larger step comes: all_logits over more rows). kNoMemory when they cannot be
  // allocated (nothing else changed); kInvalidArgument unless 1 <= n_out <= n_tokens.
  Status ReserveCompute(int n_tokens, int n_out);

  const LayerTiming& timing() const { return timing_; }
  // True when a ubatch of this model fits one graph (the metadata buffer holds kGraphSize tensors;
  // kTensorsPerLayer per layer): up to ~100 layers. Otherwise every ubatch runs layer by layer.
  bool whole_step_fits() const;

 private:
  static constexpr int kGraphSize = 4096;       // tensors of the metadata buffer, nodes of a graph
  static constexpr int kTensorsPerLayer = 40;   // BuildLayer makes at most this many (32 today)
  // One ubatch over seqs (tokens already validated, chunks reserved): KV written at each
  // sequence's positions from its kv->n_tokens(); KV lengths are not changed here.
  Status RunUbatch(const Seq* seqs, int n_seqs);
  // The graph builders (ggml order shapes; inputs and outputs outside the compute buffers are
  // tensors whose data the caller set). BuildEmbed: the token embedding of ids_ [E, n]. BuildLayer:
  // layer il over x [E, n] at positions pos [n] (od: the custom ops' LayerOpData), returns the
  // layer's output [E, n] (x is only read). BuildHead: the logits of n_out columns of act [E, n]
  // into out_ (tail: the last n_out columns, else the rows out_rows_ lists). BuildWhole: embedding,
  // every layer (od[il] each), then the head when n_out > 0 (else the last layer's output);
  // reserve: every layer from layer 0's tensors and no input data (ReserveCompute).
  ggml_tensor* BuildEmbed(ggml_context* ctx, int n);
  ggml_tensor* BuildLayer(ggml_context* ctx, int il, ggml_tensor* x, ggml_tensor* pos, void* od);
  ggml_tensor* BuildHead(ggml_context* ctx, ggml_tensor* act, int n_out, bool tail);
  ggml_tensor* BuildWhole(ggml_context* ctx, int n, int n_out, bool tail, void* const* od, bool reserve);
  // Appends each sequence's rows of out_ to its logits, in step order.
  void CopyLogits(const Seq* seqs, int n_seqs);
  Status Wait(int unit);
  // Builds the graph that ends in `out`, allocates and computes it, then frees ctx (always, also on
  // failure). NoMemory when the compute buffers cannot be allocated, Internal when compute fails.
  Status ComputeAndFree(ggml_context* ctx, ggml_tensor* out);
  // Decode without the affinity bracketing (the pass itself).
  Status DecodePass(const int32_t* tokens, int n, bool all_logits, std::vector<float>* logits);

  Model* model_;
  KvCache* kv_;
  ForwardOptions opts_;
  WaitFn wait_;
  ggml_backend* backend_ = nullptr;
  ggml_gallocr* galloc_ = nullptr;
  // Set once threads were pinned (owned; freed in the destructor or when replaced). Its size is
  // the thread count SetThreads chose (set_n_threads never exceeds it).
  ggml_threadpool* pool_ = nullptr;
  int pool_threads_ = 0;
  std::vector<int> cpus_;  // the pinned CPUs (empty: not pinned)
  std::vector<uint8_t> meta_buf_;
  std::vector<float> act_;      // residual stream [n][E] between the graphs of a layer-by-layer ubatch
  std::vector<int32_t> pos_;    // positions of the ubatch
  std::vector<int32_t> ids_;
  std::vector<int32_t> out_rows_;  // rows of act_ whose logits the ubatch computes
  std::vector<float> out_;         // those logits [n_out][n_vocab], copied to each sequence
  // Data of graph outputs while compute buffers are only reserved (never read or written).
  char reserve_only_ = 0;
  LayerTiming timing_;
};

}  // namespace mz
