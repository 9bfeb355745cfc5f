/*
 * mzcache: an on-device LLM runtime whose memory can be given back to the system unit by unit and
 * restored fast. This is the whole public API: C, opaque handles, params structs with defaults,
 * integer return codes. No C++ exception crosses it.
 *
 * Errors: every function returning int returns MZ_OK (0) or a negative mz_status. The message of
 * the last error on the calling thread is available from mz_last_error().
 *
 * Thread-safety: a model may be shared by contexts on different threads only for read-only calls
 * (tokenize, piece, info). One context must not be used from two threads at once.
 *
 * Params structs: start from mz_*_default_params() and change the fields you need. Each one's
 * first field, struct_size, is set there to the size this header declares. New fields are only
 * ever appended, each version's first new field starting at or past the previous version's size
 * (its sizeof, tail padding included), so a program built against an older header (a smaller
 * struct_size) keeps working: the fields it does not know get their defaults. A struct_size that
 * is not one this library knows (0 from a struct not made by mz_*_default_params(), or a newer
 * header's larger size) is refused with MZ_ERR_INVALID_ARG, never read past. Programs built
 * before struct_size existed are refused the same way (their first field is not a size), not
 * misread. A NULL params pointer means all defaults. Output structs (mz_model_info,
 * mz_restore_stats, mz_memory_report, mz_pressure_stats) are frozen: if they ever need more
 * fields, a new function will fill a new struct.
 */
#ifndef MZCACHE_H
#define MZCACHE_H

/* Library version (semantic: the major version changes only when the ABI breaks; it is the
 * SONAME's number, libmzcache.so.MAJOR). mz_version() returns the library's own at run time. */
#define MZ_VERSION_MAJOR 0
#define MZ_VERSION_MINOR 19
#define MZ_VERSION_PATCH 0

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t mz_token;
typedef struct mz_model mz_model;
typedef struct mz_context mz_context;

enum mz_status {
  MZ_OK = 0,
  MZ_ERR_INVALID_ARG = -1,   /* a bad request: null pointer, out-of-range value, bad token id */
  MZ_ERR_IO = -2,            /* the OS refused a read/write (EIO, ...) */
  MZ_ERR_CORRUPT = -3,       /* a file is malformed, truncated, or fails its checksum */
  MZ_ERR_UNSUPPORTED = -4,   /* a valid file this build cannot run (architecture, type) */
  MZ_ERR_NO_MEMORY = -5,     /* an allocation failed */
  MZ_ERR_NO_SPACE = -6,      /* storage full (ENOSPC) */
  MZ_ERR_BUSY = -7,          /* the operation conflicts with one in flight, or needs a restore */
  MZ_ERR_CONTEXT_FULL = -8,  /* the request would exceed n_ctx */
  MZ_ERR_MODEL_CHANGED = -9, /* the model file changed since it was loaded */
  MZ_ERR_TIMEOUT = -10,      /* a bounded wait ended with nothing to report */
  MZ_ERR_CANCELLED = -11,    /* stopped by its owner (e.g. a pressure watcher being stopped) */
  MZ_ERR_INTERNAL = -100
};

/* The library's version as "MAJOR.MINOR.PATCH" (of the libmzcache actually loaded). Never NULL. */
const char* mz_version(void);
/* Short name of a status code ("ok", "corrupt data", ...). Never NULL. */
const char* mz_status_str(int status);
/* Message of the last error on this thread (empty string if none). Valid until the next call. */
const char* mz_last_error(void);

/* ---- model ---- */
struct mz_model_params {
  uint32_t struct_size; /* set by mz_model_default_params(): see "Params structs" above */
  bool direct_io;   /* read weights with O_DIRECT (default true; falls back where unsupported) */
  int32_t io_threads; /* threads reading weights at load (default 2) */
  /* How weights are held: MZ_WEIGHTS_PAGE_CACHE (default: mapped from the model file, populated
   * from the page cache, dropped from it when evicted; no memory to zero on reload) or
   * MZ_WEIGHTS_ANONYMOUS (own anonymous memory filled by reads, direct_io applies), or (since 0.16)
   * MZ_WEIGHTS_REPACKED: each layer's matrices that this CPU has a repacked kernel for (ggml's
   * CPU_REPACK layout: on AVX2 Q4_0, Q4_K, IQ4_NL; on ARM with dotprod also Q5_K, Q6_K, Q8_0) are
   * held repacked in anonymous memory, as llama.cpp's default loader holds them (faster matmuls);
   * evicting a layer returns that memory to the OS, restoring it re-reads the layer from the file
   * (through the page cache) and repacks it. The kernel cannot reclaim these layers on its own:
   * mzcache's eviction under pressure is what gives them back (docs/residency.md). Layers with
   * nothing repackable and the embeddings stay page-cache mappings. */
  int32_t weight_memory;
};
enum { MZ_WEIGHTS_PAGE_CACHE = 0, MZ_WEIGHTS_ANONYMOUS = 1, MZ_WEIGHTS_REPACKED = 2 /* since 0.16 */ };
struct mz_model_params mz_model_default_params(void);

/* Loads a GGUF of architecture llama (3.x), qwen2 or qwen3. On failure *out is NULL. */
int mz_model_load(const char* path, const struct mz_model_params* params, mz_model** out);
/* Frees the model (NULL: nothing); its contexts and pools are freed first. Freeing the last model
 * of the process also ends the calling thread's OpenMP workers (ggml's compute threads, which
 * libgomp otherwise keeps, unjoined, until the process ends), so that a program that frees
 * everything returns from main with no library thread running beside exit(). */
void mz_model_free(mz_model* model);

struct mz_model_info {
  const char* arch;        /* "llama", "qwen2", "qwen3" */
  const char* name;        /* general.name */
  int32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
  uint64_t weight_bytes;   /* all tensor bytes */
  uint64_t kv_bytes_per_token; /* fp16 K+V over all layers */
};
int mz_model_get_info(const mz_model* model, struct mz_model_info* out);

/* Tokenizes text. Writes at most cap tokens to out and the needed count to *n_out; returns
 * MZ_ERR_INVALID_ARG if cap is too small (then *n_out tells how many are needed). */
int mz_tokenize(const mz_model* model, const char* text, bool add_special, bool parse_special, mz_token* out,
                int32_t cap, int32_t* n_out);
/* Text of one token, NUL-terminated, truncated to cap-1 bytes. Returns the full length or < 0. */
int32_t mz_token_to_piece(const mz_model* model, mz_token token, char* buf, int32_t cap);
bool mz_token_is_eog(const mz_model* model, mz_token token);
/* One chat message: role ("system", "user", "assistant") and its text. */
struct mz_chat_message {
  const char* role;
  const char* content;
};
/* Applies the model's chat template (its GGUF tokenizer.chat_template, as llama.cpp does) to n
 * messages; add_assistant appends the assistant prompt. Writes the text NUL-terminated into buf,
 * truncated to cap-1 bytes, and returns its full length (call again with a larger buf if it is >=
 * cap), or a negative status (MZ_ERR_INVALID_ARG: NULL model, role or content; MZ_ERR_UNSUPPORTED:
 * a template this build cannot apply). Since 0.7. */
int32_t mz_chat_apply_template(const mz_model* model, const struct mz_chat_message* msgs, size_t n,
                               bool add_assistant, char* buf, int32_t cap);
/* Renders OpenAI chat messages, and optionally tools, through a Jinja chat template with llama.cpp's
 * Jinja engine, as llama-server --jinja does: the path for tool calling (Qwen3's and Llama 3.x's
 * templates describe tools and tool calls). chat_template: the Jinja source to use, or NULL for the
 * model's own (its GGUF tokenizer.chat_template; as llama-server's --chat-template-file).
 * messages_json: a JSON array of messages {role, content (string, text parts or null), tool_calls
 * [{id, type:"function", function:{name, arguments}}] (assistant), tool_call_id (role "tool"), name};
 * tools_json: a JSON array of {type:"function", function:{name, description, parameters}}, or NULL
 * or "[]" for none (the template's `tools` is then undefined). add_generation_prompt opens the
 * assistant's reply. The template's clock (strftime_now, date_string) is the current local time.
 * A leading BOS text is removed when tokenizing adds BOS (as llama.cpp does).
 * Writes the text NUL-terminated into out, truncated to cap-1 bytes, and returns its full length
 * (call again with a larger buffer if it is >= cap; out may be NULL with cap 0), or a negative
 * status: MZ_ERR_INVALID_ARG (NULL model or messages_json, cap < 0, JSON that is not the shapes
 * above, or a template that fails to parse or raises while rendering (raise_exception); mz_last_error
 * has the text), MZ_ERR_UNSUPPORTED (no template: chat_template
 * NULL or empty and the model has none).
 * Thread-safe. Since 0.14. */
int32_t mz_chat_render(const mz_model* model, const char* chat_template, const char* messages_json,
                       const char* tools_json, bool add_generation_prompt, char* out, int32_t cap);

/* ---- context: one conversation (KV cache in chunks) ---- */
struct mz_context_params {
  uint32_t struct_size; /* set by mz_context_default_params(): see "Params structs" above */
  uint32_t n_ctx;            /* maximum tokens (default 8192); memory grows with use, not reserved */
  uint32_t kv_chunk_tokens;  /* tokens per KV chunk (default 256) */
  int32_t n_threads;         /* compute threads (default 2). On a heterogeneous CPU (big.LITTLE:
                                sysfs cpu_capacity / cpuinfo_max_freq differ) only the fastest
                                cluster is used by default: min(n_threads, its cores) threads pinned
                                to it (since 0.7); mz_context_set_threads overrides it */
  uint32_t n_ubatch;         /* tokens per forward graph (default 512) */
  const char* kv_codec;      /* codec for compressed KV: "q8" (default), "q4", "cachegen", "none", "lz4", "zstd" */
  const char* swap_path;     /* storage swap file (default NULL: $TMPDIR or /var/tmp, one file per context) */
  bool direct_io;            /* O_DIRECT for swap and weight reloads (default true) */
  int32_t restore_threads;   /* threads restoring units (default 2) */
  /* "Resident" means resident (since 0.6): before every mz_restore_generate, restore-ahead slice
   * and mz_evict by the policy, the context asks the kernel (mincore) which units it counts
   * resident are really in RAM. A unit of which at least this many bytes were reclaimed (the clean
   * page-cache pages of file-backed weights and of KV chunks mapped from the swap file, which a
   * memory cgroup or the OS takes under pressure) is counted evicted and restored front layers
   * first, overlapped with prefill, instead of being faulted back a page at a time during compute.
   * Default 256 KiB; 0 turns the check off (the context trusts its own count). */
  uint64_t reconcile_min_missing;
  /* since 0.9: fail at start, not later (docs/plan.md). mz_context_new estimates the peak memory of
   * this context filled to n_ctx tokens (weights, KV, compute buffers, the process's overhead: see
   * mz_plan_estimate) and, with memory_check on (the default), refuses with MZ_ERR_NO_MEMORY a
   * context whose peak exceeds the smallest of: the process's memory cgroup limit, MemAvailable +
   * the process's anonymous resident set, and memory_budget. mz_last_error then names the peak, the
   * limit and what would fit (the largest context at this memory, q8_0 KV, a smaller quant), instead
   * of the OOM killer or lmkd killing the process later. memory_check false: no check. */
  uint64_t memory_budget;    /* bytes the process may use for this model and context (0: none) */
  bool memory_check;         /* default true (false for a params struct of 0.8 or older: its
                                struct_size ends before this field) */
  /* since 0.9 */
  int32_t kv_type;           /* enum mz_kv_type: resident KV format (default MZ_KV_F16; another value:
                                mz_context_new returns MZ_ERR_INVALID_ARG) */
  /* since 0.16: a pooled conversation that returns while others generate through the pool's shared
   * pass (mz_pool_params.batch) restores its evicted units before it joins their steps. With this
   * above 0 it restores them on one thread at this nice increment (1..19), below the compute
   * threads' priority, so the others' steps keep the cores and it takes the time they leave (its
   * own first token comes later; docs/design.md "Where a returning conversation joins"). 0:
   * restore_threads threads at the caller's priority (0.13-0.15). Default 10. A thread the OS
   * refuses: the restore runs on the calling thread at its priority. */
  int32_t restore_nice_beside_batch;
};
/* Resident KV format (since 0.9). MZ_KV_Q8_0: KV rows are written as q8 blocks (int8 codes + one
 * fp16 scale per row of head_dim values) as tokens are produced and stay q8 while resident: about
 * half the KV memory (2 * n_kv_head * (head_dim + 2) bytes per token and layer instead of
 * 2 * n_kv_head * head_dim * 2), attention reads them in place. Eviction with kv_codec "q8" stores
 * the q8 rows as they are (no re-encoding); "none" / "lz4" / "zstd" are exact; "q4" / "cachegen"
 * re-quantize the decoded rows. Saved sessions load into a context of either type (converted). */
enum mz_kv_type { MZ_KV_F16 = 0, MZ_KV_Q8_0 = 1 };
struct mz_context_params mz_context_default_params(void);

int mz_context_new(mz_model* model, const struct mz_context_params* params, mz_context** out);
void mz_context_free(mz_context* ctx);

/* Appends n tokens to the context and computes logits: for every token if all_logits, else for
 * the last one. On failure the context is unchanged. */
int mz_decode(mz_context* ctx, const mz_token* tokens, int32_t n, bool all_logits);
/* Logits row i of the last mz_decode (n_vocab floats), or NULL if out of range. */
const float* mz_get_logits(mz_context* ctx, int32_t i);
int32_t mz_context_n_tokens(const mz_context* ctx);
/* Forgets tokens from position n_keep on (n_keep = 0 clears the conversation). */
int mz_context_truncate(mz_context* ctx, int32_t n_keep);
/* The turn mark (since 0.17): where the last turn's prompt ended in the context's tokens, set by
 * the app (a chat server: the start of the last reply, which tells a client's resent history that
 * continues the conversation from one that edits its last reply). Saved and loaded with the
 * session file (mz_session_save / load) and with a pool's stored files. A truncate before it, or
 * a load of a file without one, clears it. set: MZ_ERR_INVALID_ARG unless 0 <= n <= n_tokens.
 * get: the mark, or -1 when none (or ctx is NULL). */
int mz_context_set_turn_mark(mz_context* ctx, int32_t n);
int32_t mz_context_turn_mark(const mz_context* ctx);

/* Changes the context's compute threads between calls (since 0.7): n_threads threads from the
 * next mz_decode / mz_restore_generate on, pinned one per CPU to the first n_threads of
 * cpus[0..n_cpus) (CPU ids as the kernel numbers them, /sys/devices/system/cpu/cpuN), or not
 * pinned when cpus is NULL (n_cpus ignored). The conversation is kept: KV cache, tokens and the
 * last logits are untouched, and the next tokens' logits equal those of a context that never
 * changed threads (exactly on the CPU backend of this build: each output row is reduced on one
 * thread whatever their number; docs/results/threads). The calling thread of a later mz_decode
 * runs one of the compute threads: its own affinity is put back when that call returns.
 * Thread-safety: unlike the other context calls it may be called from another thread while a
 * generation (mz_decode, mz_restore_generate) or any other call holds the context: it then returns
 * MZ_ERR_BUSY at once, without waiting, and changes nothing (retry after the call).
 * Returns MZ_OK; MZ_ERR_INVALID_ARG (NULL context, n_threads outside [1, 512], n_cpus < n_threads
 * with cpus given, a CPU listed twice or one this process may not run on); MZ_ERR_BUSY as above;
 * MZ_ERR_NO_MEMORY (ggml could not make the pinned thread pool). On any error the threads and their
 * CPUs are as before the call. */
int mz_context_set_threads(mz_context* ctx, int32_t n_threads, const int32_t* cpus, int32_t n_cpus);
/* The context's compute threads now (since 0.10): *n_threads (optional) receives their number and
 * cpus (NULL with cap 0 to size) the first min(cap, n) CPU ids they are pinned to, ascending.
 * Returns n, the number of pinned CPUs (0: not pinned), or MZ_ERR_INVALID_ARG (NULL context,
 * cap < 0, cpus NULL with cap > 0). Not thread-safe with a concurrent mz_context_set_threads. */
int32_t mz_context_get_threads(mz_context* ctx, int32_t* n_threads, int32_t* cpus, int32_t cap);
/* Parses a CPU list as the kernel writes them and mz_context_set_threads takes them ("0-3,5,7-8";
 * ids below 4096) into ascending, distinct CPU ids (since 0.10). Writes the first min(cap, n) to out
 * (NULL with cap 0 to size) and returns n (0 for an empty list), or MZ_ERR_INVALID_ARG (NULL list,
 * cap < 0, out NULL with cap > 0, or text that is not a CPU list: mz_last_error quotes it). */
int32_t mz_parse_cpu_list(const char* list, int32_t* out, int32_t cap);
/* One kind of CPU of this device (since 0.10; an output struct, frozen like the others). */
struct mz_cpu_cluster {
  uint32_t capacity;     /* sysfs cpu_capacity of its fastest CPU (arm64: 1024 = the fastest core; 0: absent) */
  uint64_t max_freq_khz; /* cpufreq/cpuinfo_max_freq of its fastest CPU (0: absent) */
  int32_t n_cpus;
  uint64_t cpus[64];     /* CPU c (< 4096) belongs to it iff bit c % 64 of cpus[c / 64] is set */
};
/* The online CPUs grouped by kind, fastest first (capacity, then maximum frequency), as the default
 * pinning of mz_context_params.n_threads sees them (since 0.10): writes the first min(cap, n) to
 * out (NULL with cap 0 to size) and returns n, the number of clusters (1 on a homogeneous CPU), or
 * a negative status: MZ_ERR_INVALID_ARG (cap < 0, out NULL with cap > 0), MZ_ERR_IO /
 * MZ_ERR_CORRUPT (/sys/devices/system/cpu cannot be read or parsed: mz_last_error says why). */
int32_t mz_cpu_clusters(struct mz_cpu_cluster* out, int32_t cap);

/* ---- sustained runs: thread and duty-cycle caps, thermal stepping (since 0.9) ---- */
/* A long generation on a phone heats it and the platform throttles (clocks, cores, DRAM) after
 * ~25 s. Sustained mode steps the context's compute threads down before that and back up with
 * hysteresis, from the thermal zones (/sys/class/thermal: each zone's lowest passive trip point
 * minus a margin, or a configured high mark) or, with no readable sensor (a VM, a phone that hides
 * them from apps), from tokens/s drifting down at an unchanged thread count; and it can cap the
 * duty cycle (compute time / wall time) by sleeping after each step. Threads change through the
 * mz_context_set_threads path: the conversation and the logits are as without it. Checked once per
 * window, after mz_decode / mz_restore_generate return, on the calling thread (which also sleeps
 * for the duty cycle there). See docs/results/sustained for what the caps cost. */
/* What one window of sustained mode did to the threads (since 0.10), passed to
 * mz_sustained_params.on_event. The strings are valid during the callback only. */
struct mz_sustained_event {
  int32_t from, to;   /* compute threads before and after (refused: after = before) */
  int32_t wanted;     /* the thread count the controller asked for (= to unless refused) */
  bool refused;       /* the controller asked for a change that mz_context_set_threads' path refused */
  const char* reason; /* "hot", "drift", "cool", "probe" */
  const char* why;    /* the controller's words, e.g. "thermal_zone3 (cpu) 71.0 C >= 70.0 C" */
  int32_t status;     /* refused: the mz_status of the refusal (MZ_ERR_BUSY...); else MZ_OK */
  const char* error;  /* refused: its message; else "" */
};
struct mz_sustained_params {
  uint32_t struct_size; /* set by mz_sustained_default_params(): see "Params structs" above */
  int32_t max_threads;  /* cap (default 0: the context's compute threads when enabled; with pinned
                           CPUs at most their number: the first n of them are used) */
  int32_t min_threads;  /* never below (default 1) */
  float duty_cycle;     /* (0, 1]: compute / wall time cap (default 1: no pacing) */
  float high_c;         /* high mark in degrees C for every zone (default 0: per zone, its lowest
                           passive trip point minus trip_margin_c; zones with no trip are unused) */
  float trip_margin_c;  /* default 5 */
  float band_c;         /* hysteresis: step up only below high - band (default 5) */
  float hold_up_s;      /* ... for this long (default 30) */
  float min_interval_s; /* at most one change per interval (default 10) */
  float drift;          /* step down when a window's tokens/s < (1 - drift) x the best window of the
                           last 60 s at the same threads, twice in a row (default 0.25; 0: off) */
  float probe_up_s;     /* with no temperature, retry one more thread this long after a drift step
                           down (default 120; 0: never) */
  float window_s;       /* sensors read and decision made at most this often (default 1) */
  const char* thermal_root; /* default NULL: /sys/class/thermal (tests pass a fake tree) */
  /* since 0.10 */
  const char* thermal_zone; /* only zones whose type contains this (default NULL: every zone) */
  /* Called when a window changed the thread count or a change was refused (default NULL: not
   * reported), on the generating thread inside mz_decode / mz_restore_generate, after the step; it
   * must not call into ctx. user is passed through. */
  void (*on_event)(const struct mz_sustained_event* ev, void* user);
  void* user;
};
struct mz_sustained_params mz_sustained_default_params(void);
/* Enables (params != NULL, replacing an earlier setting) or disables (NULL) sustained mode on ctx.
 * Enabling caps the threads at once. Disabling or replacing first puts back the compute threads
 * (count and pinning) the context had when sustained mode was enabled: a new setting does not
 * start from what the old one stepped down to. Returns MZ_OK; MZ_ERR_INVALID_ARG (NULL ctx, a field out of
 * range, a bad struct_size); MZ_ERR_BUSY as mz_context_set_threads (nothing changed). Not
 * thread-safe with other calls on ctx. */
int mz_context_set_sustained(mz_context* ctx, const struct mz_sustained_params* params);
struct mz_sustained_stats {
  int32_t enabled;
  int32_t threads;            /* compute threads now */
  int32_t steps_down, steps_up;
  int32_t n_zones;            /* thermal zones read at the last window (0: no sensors) */
  int32_t has_temp;           /* a zone with a high mark was read at the last window */
  float temp_c, high_c;       /* that zone's (the one nearest its mark) temperature and mark */
  float window_tokens_per_s;  /* decode tokens per second of compute in the last window */
  double slept_s;             /* duty-cycle sleeps so far */
  double busy_s;              /* compute time of the steps seen so far */
};
/* Fills *out (zeros with enabled = 0 when sustained mode is off). May be called from any thread.
 * MZ_ERR_INVALID_ARG for NULL arguments. */
int mz_context_get_sustained_stats(mz_context* ctx, struct mz_sustained_stats* out);
/* What sustained mode works with (since 0.10; an output struct, frozen like the others). */
struct mz_sustained_info {
  int32_t enabled;
  int32_t min_threads, max_threads; /* the range it steps the compute threads in */
  int32_t threads;                  /* compute threads now */
  char sensors[256];                /* the sensors it reads, e.g. "no thermal sensors (...)" or "2 zones
                                       with trip points: ..." (truncated to fit) */
};
/* Fills *out (zeros with enabled = 0 when sustained mode is off). May be called from any thread.
 * MZ_ERR_INVALID_ARG for NULL arguments. */
int mz_context_get_sustained_info(mz_context* ctx, struct mz_sustained_info* out);

/* ---- elastic memory ---- */
enum mz_unit_kind { MZ_UNIT_WEIGHTS = 0, MZ_UNIT_KV = 1 };
enum mz_unit_state {
  MZ_STATE_RESIDENT = 0,              /* in RAM, usable by compute */
  MZ_STATE_KV_MEM_COMPRESSED = 1,     /* KV chunk compressed in the in-memory swap stack (q8: compute
                                         reads it in place, see mz_restore_params.attend_compressed) */
  MZ_STATE_KV_STORAGE_RAW = 2,        /* KV chunk raw in the storage swap file */
  MZ_STATE_KV_STORAGE_COMPRESSED = 3, /* KV chunk compressed in the storage swap file */
  MZ_STATE_WEIGHTS_DROPPED = 4        /* weight unit released; re-read from the model file */
};
/* One unit and where it should go. Weights: layer in [0, n_layer) or -1 for the base unit
 * (embeddings, output head); chunk ignored. KV: layer and chunk (tokens [chunk*T, (chunk+1)*T)). */
struct mz_placement {
  int32_t kind;   /* enum mz_unit_kind */
  int32_t layer;
  int32_t chunk;
  int32_t state;  /* enum mz_unit_state; MZ_STATE_RESIDENT restores the unit */
};
struct mz_plan {
  const struct mz_placement* items;
  size_t n_items;
};
/* Releases at least `bytes` of RAM. plan == NULL: the restoration-oriented policy decides (hybrid
 * swap, Algorithm 1 of the paper, backward-out order), continuing from whatever state earlier calls
 * left; if less than `bytes` is left in RAM it releases everything it can. plan != NULL: the
 * placements are applied in order until `bytes` are released (bytes = 0: the whole plan).
 * *freed (optional) receives what was released. While a decode runs on another thread it returns
 * MZ_ERR_BUSY and changes nothing. On an error (e.g. MZ_ERR_NO_SPACE) placements already applied
 * stay applied and the failing unit stays where it was: the context is intact. */
int mz_evict(mz_context* ctx, uint64_t bytes, const struct mz_plan* plan, uint64_t* freed);
/* Brings every unit back into RAM (multi-threaded). mz_decode restores on demand what compute
 * needs (everything but q8 chunks held compressed in memory, which it reads in place). */
int mz_restore(mz_context* ctx);

enum mz_overlap {
  MZ_OVERLAP_NONE = 0,           /* allocate all, reload all, then prefill (mz_NO) */
  MZ_OVERLAP_ALLOC_RELOAD = 1,   /* allocation and reload pipelined, then prefill (mz_AR) */
  MZ_OVERLAP_RELOAD_PREFILL = 2, /* allocate all, then reload overlapped with prefill (mz_RP) */
  MZ_OVERLAP_FULL = 3,           /* everything overlapped */
  /* Since 0.16 (the default): FULL or NONE, the restoration workers and compute's threads while
   * restoring, chosen per call from the cores, the device profile's restore rates and the
   * context's measured prefill rate: on a machine with no core beyond compute's, restoring
   * through the page cache competes with the prefill, and restoring first is faster
   * (docs/design.md, "Choosing the restore mode"). io_threads / decode_threads are then the
   * workers asked for, which the choice may lower. */
  MZ_OVERLAP_AUTO = 4
};
struct mz_restore_params {
  uint32_t struct_size; /* set by mz_restore_default_params(): see "Params structs" above */
  int32_t overlap;        /* enum mz_overlap (default MZ_OVERLAP_AUTO since 0.16; MZ_OVERLAP_FULL before) */
  int32_t io_threads;     /* storage-path workers (default 2) */
  int32_t decode_threads; /* in-memory decompression workers (default 1) */
  /* 1 (default): KV chunks held compressed in memory by the q8 codec are not restored before the
   * first token: attention reads them in place, with the same result bit for bit as decoding them
   * first. They stay compressed (mz_restore or restore-ahead bring them back; mz_decode reads them
   * in place too). 0: the paper's mzCache, every unit is restored before compute reads it. */
  int32_t attend_compressed;
  /* since 0.19, an ablation: > 0, compute keeps this many threads (at most its own) from the start
   * of an overlapped restore instead of the one fewer it runs on while restoration still needs a
   * core; 0 (default): as the restore mode decides */
  int32_t compute_threads_while_restoring;
};
struct mz_restore_params mz_restore_default_params(void);
struct mz_restore_stats {
  double ttft_s;          /* call to logits of the last input token */
  double alloc_s, reload_s; /* allocation phase, reload phase wall times */
  double wait_s;          /* compute time spent waiting for units */
  double cpu_s;           /* process CPU seconds */
  uint64_t bytes_from_storage, bytes_decoded;
  int32_t units_restored;
  uint64_t bytes_read_compressed; /* raw bytes of KV chunks attention read compressed (not restored) */
};
/* restore_generate: appends tokens and computes logits for the last one while evicted units are
 * restored front layers first; layer l computes as soon as it is resident. Then sample with
 * mz_sampler_sample(s, ctx, 0). stats may be NULL. On failure the conversation is unchanged. */
int mz_restore_generate(mz_context* ctx, const mz_token* tokens, int32_t n, const struct mz_restore_params* params,
                        struct mz_restore_stats* stats);

struct mz_memory_report {
  uint64_t weights_total, weights_resident, weights_dropped;
  uint64_t kv_total, kv_resident;
  uint64_t kv_mem_compressed_raw, kv_mem_compressed; /* raw bytes represented, bytes held */
  uint64_t kv_storage_raw;
  uint64_t kv_storage_compressed_raw, kv_storage_compressed;
  uint64_t swap_stack_mapped; /* RAM held by the in-memory swap */
  uint64_t swap_file_used;    /* storage held by the swap file */
  uint64_t in_memory;         /* weights_resident + kv_resident + swap_stack_mapped */
  uint64_t footprint;         /* weights_total + kv_total */
  double remaining;           /* in_memory / footprint (the paper's "remaining in memory") */
  int32_t n_weight_units[5], n_kv_chunks[5]; /* per enum mz_unit_state */
  int32_t n_kv_lost;          /* chunks whose stored copy failed verification */
};
int mz_get_memory_report(mz_context* ctx, struct mz_memory_report* out);
/* What the kernel holds of the memory the context counts resident (mincore over every resident
 * weight unit and KV chunk; the in-memory swap is not included): *counted (optional) receives the
 * bytes counted resident, *in_ram (optional) the part of them in RAM now. in_ram < counted means
 * the kernel reclaimed pages behind the context's back (the next mz_restore_generate restores
 * them, see mz_context_params.reconcile_min_missing). About 1 ms per GiB. Waits for a running
 * decode. */
int mz_kernel_residency(mz_context* ctx, uint64_t* counted, uint64_t* in_ram);

/* ---- residency as the kernel sees it, unit by unit (since 0.9) ----
 * For every weight unit and KV chunk: the context's own state and the kernel's view of its memory:
 * what backs it, how much of it is in RAM (mincore), how much of its copy in a file the page cache
 * holds, and the Rss/Pss of its mappings (/proc/self/smaps). The kernel accounts smaps per VMA,
 * not per unit: a unit's vma_* fields are those of every VMA overlapping it, whole. When vma_bytes
 * equals held_bytes they are exactly the unit's (a weight unit's file mappings usually are); when
 * larger, the VMA also holds other memory (the kernel merges adjacent anonymous KV chunks into one
 * VMA) and Rss/Pss are the VMA's. in_ram_bytes is always exact per unit. mincore says whether a
 * file page is in the page cache; Rss counts it only while this process maps it. */
enum mz_backing {
  MZ_BACKING_NONE = 0,       /* holds no memory in its state (weights dropped, KV on storage) */
  MZ_BACKING_ANONYMOUS = 1,  /* anonymous memory (the kernel can only swap it out) */
  MZ_BACKING_MODEL_FILE = 2, /* private read-only mapping of the model file: clean page cache the
                                kernel may reclaim under pressure (compute then faults it back) */
  MZ_BACKING_SWAP_FILE = 3   /* private mapping of the swap file (a KV chunk restored by mapping) */
};
struct mz_unit_residency {
  int32_t kind;      /* enum mz_unit_kind */
  int32_t layer;     /* weights: layer, -1 the base unit (embeddings, output head); KV: layer */
  int32_t chunk;     /* KV: chunk; weights: -1 */
  int32_t state;     /* enum mz_unit_state: the context's own count */
  int32_t backing;   /* enum mz_backing */
  int32_t lost;      /* 1: a KV chunk whose stored copy failed verification */
  uint64_t bytes;    /* RAM the unit takes when resident */
  uint64_t held_bytes; /* RAM the context counts for it now (bytes if resident, its encoded bytes if
                          compressed in memory, else 0) */
  uint64_t address;  /* where those bytes start in this process (0: none) */
  uint64_t counted_bytes, in_ram_bytes; /* mincore: bytes asked about (its mapped pages) and, of
                          them, in RAM now; counted > in_ram: the kernel took pages behind the
                          context's back */
  uint64_t file_bytes, file_cached_bytes; /* its copy in a file (weights: the model file; KV on
                          storage: its swap extent) and the part the page cache holds (a restore
                          reads that part without storage I/O); 0 of 0 if none */
  int32_t n_vmas;    /* smaps: the VMAs overlapping [address, address + held_bytes), whole */
  uint64_t vma_bytes, vma_rss, vma_pss, vma_anonymous, vma_swap;
};
struct mz_residency_summary {
  int32_t n_units;   /* weight units (layers, then the base unit) + KV chunks (layer by layer) */
  /* mincore over what the context counts in RAM, by kind of memory: counted / in RAM */
  uint64_t weights_file_counted, weights_file_in_ram; /* resident weights mapped from the model file */
  uint64_t weights_anon_counted, weights_anon_in_ram; /* resident weights in anonymous memory */
  uint64_t kv_counted, kv_in_ram;                     /* resident KV chunks */
  uint64_t kv_compressed_counted, kv_compressed_in_ram; /* pages of KV chunks compressed in memory */
  /* The warning: resident weight units mapped from the model file with pages the kernel reclaimed.
   * A decode then stalls on major faults, reading them from storage a page at a time every token;
   * mz_restore, or mz_restore_generate (which reconciles, see reconcile_min_missing), reads them
   * back ahead. */
  int32_t weight_units_out_of_page_cache;
  uint64_t weights_out_of_page_cache; /* their bytes not in RAM */
  bool warn;
  char warning[384]; /* "" or the warning as a sentence (truncated to fit) */
  bool smaps_ok;     /* false: smaps was not asked for, or could not be read or parsed: */
  char smaps_error[256]; /* why ("" when smaps_ok); the rest of the report is complete */
  int32_t n_vmas;    /* distinct VMAs overlapping some unit, and their totals (each counted once) */
  uint64_t vma_bytes, vma_rss, vma_pss, vma_anonymous, vma_swap;
};
/* Measures every unit of the context. summary (optional) receives the totals and the warning;
 * units (NULL with cap 0 to size) receives the first min(cap, n) units. with_smaps = false skips
 * /proc/self/smaps (its cost grows with the process's mappings). Returns n, the number of units
 * (>= 0), or a negative status: MZ_ERR_INVALID_ARG (NULL ctx, cap < 0, units NULL with cap > 0),
 * an error of mincore (MZ_ERR_IO...); *summary is then zeroed. Waits for a running call on the
 * context (a foreground call: restore-ahead yields to it). Cost: one mincore per unit (as
 * mz_kernel_residency), one page-cache query per unit with a file copy, and smaps. Both structs
 * are output structs, frozen like the others (see the top of this header). */
int32_t mz_residency_report(mz_context* ctx, bool with_smaps, struct mz_residency_summary* summary,
                            struct mz_unit_residency* units, int32_t cap);

/* ---- sessions: a conversation saved to a file and loaded in another process ---- */
/* What a session file holds (since 0.10; an output struct, frozen like the others). */
struct mz_session_info {
  int32_t n_tokens;
  int32_t n_chunks;  /* KV chunks per layer */
  char codec[32];    /* the KV codec it was saved with ("q8", "none", ...) */
  uint64_t file_bytes;
};
/* Reads the header and index of the session file at path as mz_session_load into ctx would check
 * them (model identity, KV geometry, checksums of header and index; no chunk is read and ctx is not
 * changed) and fills *out. Whether n_tokens fits the context's n_ctx is not checked (mz_session_load
 * refuses a longer one with MZ_ERR_CONTEXT_FULL). Returns MZ_OK; MZ_ERR_INVALID_ARG (NULL
 * argument); MZ_ERR_IO (cannot be read); MZ_ERR_CORRUPT (damaged, or saved with another model or
 * another KV geometry such as the chunk size: mz_last_error says which). *out is zeroed on error. */
int mz_session_get_info(mz_context* ctx, const char* path, struct mz_session_info* out);
/* Writes tokens + KV (codec "none" is lossless; default q8 when NULL) crash-safely. */
int mz_session_save(mz_context* ctx, const char* path, const char* codec);
/* Replaces the context's conversation with the file's; on error the context is unchanged. */
int mz_session_load(mz_context* ctx, const char* path);

/* ---- sampling ---- */
struct mz_sampler_params {
  uint32_t struct_size; /* set by mz_sampler_default_params(): see "Params structs" above */
  float temperature; /* <= 0: greedy (default 0) */
  int32_t top_k;     /* default 40 */
  float top_p;       /* default 0.95 */
  uint32_t seed;     /* default 42 */
};
struct mz_sampler_params mz_sampler_default_params(void);
typedef struct mz_sampler mz_sampler;
/* NULL on a bad params struct (mz_last_error says why) or when out of memory. */
mz_sampler* mz_sampler_new(const struct mz_sampler_params* params);
void mz_sampler_free(mz_sampler* s);
/* Samples from logits row i of the last decode; returns the token or a negative status. */
mz_token mz_sampler_sample(mz_sampler* s, mz_context* ctx, int32_t i);

/* ---- memory pressure: give memory back when the system needs it (see docs/pressure.md) ----
 * Unlike the rest of the context API, mz_on_trim_memory, mz_evict and the mz_pressure_* functions
 * may be called from another thread while mz_decode / mz_restore_generate run on the context: they
 * never wait for a generation. A request that arrives during one is queued and applied at its next
 * safe point (right after the running mz_decode / mz_restore_generate call finishes, on that
 * thread), never tearing state. */

/* Android ComponentCallbacks2.TRIM_MEMORY_* values, as passed to Application.onTrimMemory(). */
enum mz_trim_level {
  MZ_TRIM_MEMORY_RUNNING_MODERATE = 5,
  MZ_TRIM_MEMORY_RUNNING_LOW = 10,
  MZ_TRIM_MEMORY_RUNNING_CRITICAL = 15,
  MZ_TRIM_MEMORY_UI_HIDDEN = 20,
  MZ_TRIM_MEMORY_BACKGROUND = 40,
  MZ_TRIM_MEMORY_MODERATE = 60,
  MZ_TRIM_MEMORY_COMPLETE = 80
};
/* Reacts to Android's onTrimMemory(level). Levels between the defined values count as the next
 * lower one (Android's own advice: compare with >=). The step is a share of the LLM memory (the
 * footprint above the embeddings/output base unit) set by mz_pressure_params (default 25 points;
 * repeated events escalate, events within the hysteresis window merge, never below the floor):
 *   0..4                          nothing
 *   5  RUNNING_MODERATE, 10 RUNNING_LOW   low:      one step
 *   15 RUNNING_CRITICAL, 40 BACKGROUND    medium:   one escalated step (step * escalation)
 *   20 UI_HIDDEN                  nothing (the UI went away; no memory was asked for)
 *   60 MODERATE, 80 COMPLETE      critical: everything down to the floor
 * Nothing is restored eagerly: the next mz_restore_generate brings units back overlapped with the
 * prefill (or in the background after calm, if a watcher was started with restore_in_background).
 * Returns MZ_OK when handled (possibly giving back nothing: merged, at the floor, level without
 * action); MZ_ERR_BUSY when a generation holds the context: the request is queued and applied at
 * its next safe point (nothing to retry); MZ_ERR_INVALID_ARG for a NULL context or a negative
 * level; an eviction error (e.g. MZ_ERR_NO_SPACE) leaves the context intact. Uses the context's
 * watcher if one runs (one policy state per context), else the default mz_pressure_params. */
int mz_on_trim_memory(mz_context* ctx, int32_t level);

/* One action of a context's pressure handling (since 0.10), passed to mz_pressure_params.on_action.
 * The strings are valid during the callback only. */
struct mz_pressure_action {
  const char* source;      /* the event's source: the watcher's ("psi", "cgroup-v1:..."), the one given
                              to mz_pressure_submit, "onTrimMemory(N)", or "restore-ahead" (a
                              background restore waiting for free memory, or restored: see restored) */
  int32_t level;           /* 0 none, 1 low, 2 medium, 3 critical */
  const char* level_name;  /* "none", "low", "medium", "critical" */
  uint64_t requested;      /* bytes the amount policy asked for (0: nothing to do, see note) */
  uint64_t freed;          /* bytes given back */
  bool deferred;           /* arrived during a generation, applied at a safe point after it */
  bool restored;           /* a background restore slice of restored_bytes, not an eviction */
  uint64_t restored_bytes;
  double remaining;        /* mz_memory_report.remaining after the action (in_memory / footprint; it
                              counts the in-memory swap's mapped segments, so it can exceed 1) */
  double delay_s;          /* from the event to the action */
  uint32_t repeats;        /* further identical nothing-done events coalesced into this one */
  int32_t status;          /* MZ_OK, or the action's error (e.g. MZ_ERR_NO_SPACE: the context is intact) */
  const char* error;       /* its message ("" with MZ_OK) */
  const char* note;        /* why nothing was done ("merged", "at floor", ...), or "" */
};
struct mz_pressure_params {
  uint32_t struct_size; /* set by mz_pressure_default_params(): see "Params structs" above */
  const char* source;       /* "auto" (default), "psi", "cgroup-v1", "watermark", "manual" */
  const char* cgroup_dir;   /* cgroup to watch (v1 memory cgroup or v2 dir); NULL: system-wide */
  float step_points;        /* share of LLM memory per event (default 0.25; the paper: 0.15-0.25) */
  float escalation;         /* step multiplier for a repeated event (default 1.5) */
  float max_step_points;    /* cap of an escalated step (default 1.0) */
  float floor_points;       /* never give back below this share (default 0) */
  uint32_t escalation_window_ms; /* events this close to the last applied one escalate (5000) */
  uint32_t hysteresis_ms;   /* same-or-lower level events this close merge (default 1000) */
  bool restore_in_background; /* restore once calm (default false: on the next request) */
  uint32_t calm_ms;         /* calm needed before a background restore (default 10000); it then
                               restores in slices, front layers first, as far as memory is free */
  uint32_t psi_stall_us;    /* PSI trigger stall (default 150000) ... */
  uint32_t psi_window_us;   /* ... within this window (default 1000000; rounded to 2 s unprivileged) */
  uint32_t poll_ms;         /* watermark poller period (default 100) */
  float restore_margin;     /* background restore: restore only what fits while this share of the
                               watched limit (cgroup limit or MemTotal) stays free (default 0.2) */
  /* since 0.10: called after every action of the watcher this params struct starts (default NULL:
   * not reported), on the thread that applied it: the watcher's, a safe point's (the generating
   * thread, right after its call), or mz_pressure_submit's caller. It must not call into ctx.
   * user is passed through. */
  void (*on_action)(const struct mz_pressure_action* action, void* user);
  void* user;
};
struct mz_pressure_params mz_pressure_default_params(void);
/* Starts a thread that watches the system's memory pressure (source per params; "auto" picks
 * cgroup v1 notifications for cgroup_dir, else PSI, else the MemAvailable watermark) and gives
 * memory back by itself. params NULL: defaults. Returns MZ_OK; MZ_ERR_INVALID_ARG (NULL context,
 * out-of-range value, unknown source); MZ_ERR_UNSUPPORTED (the requested source does not work on
 * this machine; mz_last_error says why); MZ_ERR_BUSY (already watching: stop first); or the OS
 * error arming the source. */
int mz_pressure_watch_start(mz_context* ctx, const struct mz_pressure_params* params);
/* Stops the watcher (joins its thread). MZ_OK, also when none runs. Call before mz_context_free
 * only if you need the thread gone earlier: mz_context_free stops it too. Its on_action is not
 * called again once this returns (since 0.10): its user data may be freed. mz_on_trim_memory and
 * mz_pressure_submit go on with its amounts, unreported. */
int mz_pressure_watch_stop(mz_context* ctx);

struct mz_pressure_stats {
  bool watching;            /* a watcher thread runs */
  char source[192];         /* active source, e.g. "cgroup-v1:/sys/fs/cgroup/memory/app" ("" if none) */
  uint32_t events;          /* events handled (including merged / nothing-to-do ones) */
  uint32_t evictions;       /* events that gave memory back */
  uint32_t deferred;        /* of those, applied at a safe point after a generation */
  uint32_t restores;        /* background restore slices (restore-ahead) */
  uint64_t bytes_freed;     /* total given back */
  int32_t pending;          /* 1 if a request waits for a safe point */
  int32_t last_level;       /* 0 none, 1 low, 2 medium, 3 critical (of the last event) */
  uint64_t last_freed;      /* bytes given back by the last event */
  double last_remaining;    /* share of LLM memory resident after the last action */
  uint64_t bytes_restored;  /* total restored ahead in the background */
};
/* Statistics of the context's pressure handling (all zero if it never saw an event). */
int mz_pressure_get_stats(mz_context* ctx, struct mz_pressure_stats* out);
/* Why the running watcher uses its source (since 0.10): which one "auto" chose and why the others
 * were not, as text, into buf NUL-terminated (truncated to cap-1 bytes; buf may be NULL with cap 0).
 * Returns its full length (0: no watcher runs), or MZ_ERR_INVALID_ARG (NULL ctx, cap < 0, buf NULL
 * with cap > 0). */
int32_t mz_pressure_watch_reason(mz_context* ctx, char* buf, int32_t cap);
/* Handles one pressure event of level (0 none, 1 low, 2 medium, 3 critical: as a watcher's source
 * reports them) named source (NULL: "manual") exactly as the context's watcher would: the amounts of
 * its params (without a watcher, of the default mz_pressure_params, as mz_on_trim_memory), its
 * on_action called on this thread (since 0.10; a simulated event, e.g. for a shell command). Level
 * 0 gives nothing back; it only tells the policy that the pressure is gone. Returns as
 * mz_on_trim_memory: MZ_OK when handled, MZ_ERR_BUSY when queued behind a generation (applied at
 * its safe point; nothing to retry), MZ_ERR_INVALID_ARG (NULL ctx, level outside 0..3), or an
 * eviction error (the context intact). May be called from another thread as mz_on_trim_memory. */
int mz_pressure_submit(mz_context* ctx, int32_t level, const char* source);
/* Declares a generation of several calls (since 0.10), e.g. one chat reply from its prefill to its
 * last token: while generating is true, events below critical that arrive are not applied at the
 * safe point after each mz_decode but when generating is set false again (itself a safe point: the
 * queued eviction runs on this thread then); critical events still pause the generation at its next
 * safe point. Applies to the context's watcher or mz_on_trim_memory's handler, and to one started
 * later. Returns MZ_OK, or MZ_ERR_INVALID_ARG for a NULL ctx. Call from the generating thread. */
int mz_pressure_set_generating(mz_context* ctx, bool generating);

/* ---- device profile: the throughputs the eviction policy balances (paper 4.3) ----
 * Measured once per device (and storage): codec encode/decode throughput and ratio on real KV of
 * a model, what attention pays to read q8 chunks in place, direct-I/O reads by request size and
 * page-cache reads into mappings by piece size of the storage holding `dir`, and the cost of fresh
 * anonymous memory. The result is a JSON file the runtime and `mzcache profile` use; per-unit
 * times for any model are derived from it without profiling again. */
struct mz_profile_params {
  uint32_t struct_size; /* set by mz_profile_default_params(): see "Params structs" above */
  const char* dir;      /* folder on the storage to profile, where swap files live (default NULL:
                           /var/tmp; "" is refused); a read-test file is written there and removed
                           before return */
  uint32_t file_mib;    /* size of that file in MiB (default 512; reads use its first 256 MiB) */
  int32_t threads;      /* most decode threads measured, for the report (default 2; 1..256) */
  bool quick;           /* small and fast, for tests and a first look (default false): fewer
                           repetitions, a smaller in-place and allocation test; noisier figures.
                           Set file_mib small too (e.g. 8) */
  /* Called on the calling thread after each step: its name, steps done and steps in all (the
   * profile takes tens of seconds). NULL: no progress. */
  void (*progress)(const char* step, int32_t done, int32_t total, void* user);
  /* Called on the calling thread with the measured figures as human-readable text (markdown tables
   * and notes, each piece ending in a newline) as they come, and warnings (e.g. a folder without
   * O_DIRECT: figures then include the page cache). NULL: nothing reported. */
  void (*report)(const char* text, void* user);
  void* user; /* passed to progress and report */
  /* since 0.17: the remote tier's store (redis://[user[:password]@]host:port[/db], as
   * mz_pool_params' remote_url) whose read rate and time to first byte the profile measures (a few
   * chunk-sized values written, read back in one pipeline and removed). NULL or "" (default): not
   * measured, reported so (the pool then learns the rate at run time). */
  const char* remote_url;
  /* since 0.19: with a rediss:// remote_url, the PEM certificate authorities to trust (a Redis with
   * a private CA's certificate); NULL (default): the system's. Read before anything is measured:
   * an unreadable or bad file is MZ_ERR_INVALID_ARG (or the read's error) naming it, as is a CA
   * file with a redis:// URL. */
  const char* remote_ca_file;
};
struct mz_profile_params mz_profile_default_params(void);
/* Profiles this device with the KV of the model at model_path (loaded, a 512-token prefill of
 * built-in English prose; any GGUF mz_model_load accepts) and writes the profile to out_path
 * (JSON, replaced whole). params NULL: defaults. Returns MZ_OK; MZ_ERR_INVALID_ARG (NULL path, a
 * bad params struct or value); the model's load error (MZ_ERR_IO, MZ_ERR_CORRUPT,
 * MZ_ERR_UNSUPPORTED); MZ_ERR_IO or MZ_ERR_NO_SPACE (the read-test file could not be written or
 * read in dir, or out_path could not be written, or the remote_url store could not be reached: it
 * is measured first, nothing is written then); MZ_ERR_UNSUPPORTED (a rediss:// remote_url, or no
 * Redis client built in); MZ_ERR_INVALID_ARG (a remote_url that is not such a URL);
 * MZ_ERR_CORRUPT (a value read back from remote_url differed); MZ_ERR_NO_MEMORY (the allocation
 * test could not map memory). out_path is replaced crash-safely (written beside it, synced, renamed): on an error
 * or a crash it keeps its previous content; the read-test file is removed on every path. */
int mz_profile_device(const char* model_path, const struct mz_profile_params* params, const char* out_path);

/* ---- memory plan: the peak a run will need, known before it starts (since 0.9) ----
 * The peak resident set of a run that fills n_ctx tokens with nothing evicted, by part, set against
 * what the process may use. Parts: weights (every weight unit; file-backed page-cache mappings the
 * kernel can reclaim, so a run that does not fit thrashes, or anonymous memory it cannot, so a run
 * that does not fit is killed); KV at n_ctx tokens in whole kv_chunk_tokens chunks (f16:
 * 2*n_layer*n_kv_head*head_dim*2 bytes per token; q8_0: 2*n_layer*n_kv_head*(2+head_dim)); the
 * compute buffers of one ubatch; the in-memory swap stack (0: it only holds KV that left RAM,
 * compressed); overhead (this process's resident set now + the tokenizer and model metadata).
 * Limits (0 when unknown): the memory cgroup limit, MemAvailable + this process's anonymous RSS,
 * memory_budget. The estimate is within 5% of the measured peak RSS on this engine
 * (tests/test_memory_plan.cpp, docs/plan.md). */
struct mz_plan_params {
  uint32_t struct_size;     /* set by mz_plan_default_params(): see "Params structs" above */
  uint32_t n_ctx;           /* context to plan (default 8192); 0: the largest that fits with the
                               margin, at most the model's training context (auto) */
  uint32_t kv_chunk_tokens; /* default 256 */
  uint32_t n_ubatch;        /* default 512 */
  int32_t kv_type;          /* enum mz_kv_type (default MZ_KV_F16) */
  int32_t weight_memory;    /* MZ_WEIGHTS_PAGE_CACHE (default), MZ_WEIGHTS_ANONYMOUS or MZ_WEIGHTS_REPACKED */
  uint64_t memory_budget;   /* a budget to plan against (0: none) */
  float margin;             /* share of the limit kept free by max_ctx and auto (default 0.1) */
};
struct mz_plan_params mz_plan_default_params(void);
struct mz_plan_result {
  /* the model */
  int32_t n_layer, n_head_kv, head_dim, n_vocab;
  uint64_t weight_params;        /* tensor elements */
  uint64_t kv_bytes_per_token;   /* of the planned kv_type, before chunk rounding */
  /* the peak at n_ctx, by part (bytes) */
  uint32_t n_ctx;                /* planned (auto: the one chosen; 0 if nothing fits) */
  uint64_t weights;
  bool weights_file_backed;
  uint64_t kv, compute, swap_stack, overhead, peak;
  /* the limits (bytes; 0 = unknown / none) */
  uint64_t cgroup_limit, mem_available, mem_total, self_anon, memory_budget;
  uint64_t limit;                /* the smallest known: what the peak is set against (0: none) */
  char binding[32];              /* which limit that is ("cgroup limit", "MemAvailable", "memory budget", "") */
  bool fits;                     /* peak <= limit (true when no limit is known) */
  uint32_t max_ctx;              /* largest context (whole chunks, at most the model's training
                                    context) whose peak with the planned kv_type is <= (1-margin)*limit */
  uint32_t max_ctx_q8;           /* the same with q8_0 KV */
};
/* Plans a run of the model at model_path (only its header is read: nothing is loaded) with params
 * (NULL: defaults) in this process. Returns MZ_OK with *out filled; MZ_ERR_INVALID_ARG (NULL
 * path/out, bad params); the model's parse error (MZ_ERR_IO, MZ_ERR_CORRUPT, MZ_ERR_UNSUPPORTED).
 * It does not refuse: out->fits says whether it fits. */
int mz_plan_estimate(const char* model_path, const struct mz_plan_params* params, struct mz_plan_result* out);
/* A model that does not exist yet, by shape (device tiers: what would fit): weight_bytes and
 * weight_params as the file would have them, weight_type its matrix format ("f16", "q8_0", "q4_0",
 * "q4_k"). The overhead is this process's resident set + the tokenizer of n_vocab tokens. An input
 * description, frozen like the output structs (no struct_size): a future need gets a new function. */
struct mz_plan_shape {
  int32_t n_layer, n_head, n_head_kv, head_dim, n_embd, n_ff, n_vocab;
  uint64_t weight_bytes, weight_params;
  const char* weight_type;
};
int mz_plan_estimate_shape(const struct mz_plan_shape* shape, const struct mz_plan_params* params,
                           struct mz_plan_result* out);

/* ---- pool: one model, many conversations, one memory budget, nothing lost (since 0.7) ----
 * A pool holds many conversations over one model (its weights held once). Each conversation is a
 * context of its own (KV in 256-token chunks, each resident, compressed in memory or on storage).
 * The pool keeps RAM within memory_budget after every call, giving back in this order: idle
 * conversations' KV (least recently used first), then the most recently used conversation's KV
 * (hybrid-swap placement, later layers first), then weights (only while no conversation computes).
 * Eviction never waits for a generation.
 * With a folder, every conversation is also written there (write-behind: after
 * mz_conversation_commit, or once it has been idle for write_behind_idle_ms), crash-safely: a
 * kill -9 loses at most the turn not yet committed. A new pool on the same folder finds every
 * stored conversation again; a damaged file is reported (mz_pool_damaged) and skipped. Beyond
 * disk_budget the least recently used conversations are deleted, each counted in
 * conversations_lost; nothing else deletes one but mz_pool_delete.
 * Shared prefixes: the first call on an empty conversation reuses the longest run of full chunks
 * that another conversation (open in any tier, or stored) has for the same tokens, confirmed token
 * by token: those chunks' KV is copied, not computed.
 * Thread-safety: pool functions may be called from any thread. Calls on one conversation are
 * serialized; distinct conversations may run on distinct threads at once, and since 0.13 the calls
 * running at the same moment share one forward pass (mz_pool_params.batch: continuous batching). */
typedef struct mz_pool mz_pool;
typedef struct mz_conversation mz_conversation;

struct mz_pool_params {
  uint32_t struct_size;         /* set by mz_pool_default_params(): see "Params structs" above */
  const char* dir;              /* folder of stored conversations (created); NULL: nothing persisted */
  uint64_t memory_budget;       /* RAM for weights + all conversations' KV and in-memory swap; 0: none */
  uint64_t disk_budget;         /* bytes of stored conversations; 0: none */
  const char* persist_codec;    /* codec of stored conversations: NULL = "q8" (default); "none" is lossless */
  bool write_behind;            /* persist on a background thread (default true); false: in commit */
  uint32_t write_behind_idle_ms;/* a changed conversation idle this long is persisted (default 2000) */
  bool share_prefixes;          /* reuse other conversations' matching prefix chunks (default true) */
  const struct mz_context_params* context; /* each conversation's context (NULL: defaults). swap_path
                                   NULL: <dir>/swap/<id>.swap; else the path + "." + id */
  /* since 0.8 */
  bool read_stored_whole;       /* false (default): a stored conversation's file is its storage tier,
                                   restored front layers first while prefill runs (needs persist_codec
                                   equal to the context's kv_codec); true: read whole when opened */
  /* since 0.12 */
  uint64_t load_arena_bytes;    /* the load arena: in-memory swap segments that evictions free are
                                   kept (mapped, touched) up to this many bytes, inside memory_budget,
                                   and the next conversation loaded from storage fills them instead of
                                   fresh memory; mz_pool_evict and pressure give it back first.
                                   UINT64_MAX (default): min(256 MiB, memory_budget / 8) with a budget,
                                   else 0; 0: none */
  uint32_t write_behind_yield_ms; /* a background write waits between chunks while another
                                   conversation computes its first token (restore and prefill), at
                                   most this long in all per write (default 2000); it goes on at once
                                   when a caller waits for the conversation it writes or for a write,
                                   or another write is queued. 0: never waits */
  /* since 0.13: many users at once */
  bool batch;                   /* one forward pass for every conversation that is generating
                                   (default true): calls on distinct conversations made from
                                   distinct threads at the same time are computed together, a step
                                   at a time (each decode token, and prompts in slices, share the
                                   matrix products; attention runs per conversation over its own
                                   KV in any tier). One set of compute buffers for the pool, counted
                                   in memory_budget. A conversation whose KV or weights must come
                                   back restores front layers first while its prefill runs when
                                   nothing else generates; while others do, it restores first
                                   (beside their steps) and then joins. false: each conversation
                                   computes on its own pass */
  int32_t batch_max_seqs;       /* conversations per step at most (default 64; 1..n_ubatch) */
  int32_t batch_prefill_slice;  /* prompt tokens per step at most while other conversations decode
                                   (default 512): a long prompt is cut so the others' tokens keep
                                   coming (chunked prefill) */
  float batch_itl_factor;       /* while decoding conversations outnumber the waiting prompts, a
                                   prompt slice is sized (from measured step times) so that a step
                                   takes at most this many times a step without prompt tokens: the
                                   others' inter-token latency (default 2; at least 8 tokens a step;
                                   0: batch_prefill_slice, fixed). With as many prompts waiting as
                                   conversations decoding, prompts get whole steps */
  /* since 0.15: several models, one budget */
  struct mz_budget* shared_budget; /* NULL (default): the pool's own memory_budget. Else this
                                   pool's RAM counts in that shared budget with every other pool
                                   naming it (each its own model), and budget passes and pressure
                                   (mz_pool_on_trim_memory, the pressure watch) run across them all:
                                   see mz_budget below. memory_budget must then be 0 (else
                                   MZ_ERR_INVALID_ARG) and load_arena_bytes is taken as 0. The
                                   pool holds the budget (mz_budget_free may come before mz_pool_free) */
  /* also since 0.15: a fleet's remote tier (docs/fleet.md) */
  const char* remote_url;       /* redis://[user[:password]@]host:port[/db]: conversations and full
                                   chunks also kept in a Redis shared by a fleet of servers, written
                                   behind the local persist (needs dir), so that any server continues
                                   any conversation: mz_pool_open of an id this pool does not hold
                                   fetches it (verified; what fails verification is computed again),
                                   and an empty conversation's first call finds its longest stored
                                   prefix there by chain hash. Redis down: the pool goes on with its
                                   local tiers (mz_pool_remote_report.degraded) and catches up when it
                                   is back. rediss://... (since 0.18): over TLS 1.2+, the server's
                                   certificate verified (remote_ca_file) and its name checked
                                   against the host (MZ_ERR_UNSUPPORTED in a build without
                                   OpenSSL). NULL (default): none */
  const char* remote_password_file; /* its first line is the password (the URL's user is the ACL
                                   user); NULL: the URL's, if any */
  uint32_t remote_timeout_ms;   /* connect and each reply (default 2000) */
  uint32_t remote_ttl_s;        /* every key's time to live, refreshed by each write and fetch: how
                                   chunks no conversation names any more are reclaimed (default
                                   604800, 7 days) */
  /* since 0.18: TLS (a rediss:// remote_url only; any of them with redis:// is MZ_ERR_INVALID_ARG).
     Read at mz_pool_new: an unreadable or bad file is MZ_ERR_INVALID_ARG (or the read's error)
     naming it. */
  const char* remote_ca_file;   /* PEM certificate authorities to trust; NULL (default): the
                                   system's (the file $SSL_CERT_FILE names, else OpenSSL's default) */
  const char* remote_cert_file; /* PEM client certificate (for Redis's tls-auth-clients), with
                                   remote_key_file (both or neither); NULL (default): none */
  const char* remote_key_file;  /* its unencrypted PEM private key; NULL (default): none */
  /* since 0.19 */
  bool remote_prefix_whole;     /* an empty conversation's prefix found in Redis by chain hash is
                                   fetched whole and verified before its prefill (true), instead of
                                   streamed in front layers first, overlapped with the prefill, as a
                                   conversation opened by id is (false, default): the peer the
                                   streamed path is measured against (bench fleet) */
};
struct mz_pool_params mz_pool_default_params(void);
/* Creates a pool over model (which must outlive it) and finds the conversations stored in dir. */
int mz_pool_new(mz_model* model, const struct mz_pool_params* params, mz_pool** out);
/* Persists every changed conversation, then frees the pool. Handles must be released before. */
void mz_pool_free(mz_pool* pool);

/* Opens conversation id (1-128 of [A-Za-z0-9._-], not starting with '.'): the open one, a stored
 * one (its KV read back from the folder) or a new empty one. *out: a handle, released with
 * mz_conversation_release (which does not close the conversation). */
int mz_pool_open(mz_pool* pool, const char* id, mz_conversation** out);
void mz_conversation_release(mz_conversation* conv);
/* Persists it and frees its memory; it stays stored (without a folder: deleted). Handles on it
 * then return MZ_ERR_INVALID_ARG. MZ_ERR_BUSY if it changed during the close (close again). */
int mz_pool_close(mz_pool* pool, const char* id);
/* Forgets it: memory, swap and stored file. */
int mz_pool_delete(mz_pool* pool, const char* id);
/* Gives back at least bytes of RAM in the pool's order, or all it can (*freed, optional). */
int mz_pool_evict(mz_pool* pool, uint64_t bytes, uint64_t* freed);
/* Persists every changed conversation now (returns the first error). */
int mz_pool_flush(mz_pool* pool);
/* Android's onTrimMemory(level) for the whole pool: the levels and amounts of mz_on_trim_memory
 * (default mz_pressure_params: 25 points of the pool's LLM memory per event, escalating, merged
 * within 1 s, everything at MODERATE/COMPLETE), given back in the pool's order. Never waits for a
 * generation (what is busy is skipped). *freed (optional) receives what was given back. */
int mz_pool_on_trim_memory(mz_pool* pool, int32_t level, uint64_t* freed);
/* Starts a thread that watches the system's memory pressure for the whole pool (the sources and
 * amounts of mz_pressure_watch_start, since 0.8): every event gives back a share of the pool's LLM
 * memory in the pool's order (idle conversations first, weights last), never waiting for a
 * generation. params NULL: defaults. restore_in_background (since 0.9; before, MZ_ERR_UNSUPPORTED):
 * once calm_ms passed without an event, the watcher brings back what pressure took, in slices that
 * fit the free memory (restore_margin kept free) and never past the pool's memory budget: the
 * weights first, then the open conversations' KV, most recently used first, each yielding to a
 * call that arrives on it; without it a conversation is restored by its next call. Returns MZ_OK;
 * MZ_ERR_INVALID_ARG; MZ_ERR_UNSUPPORTED (the source does not work here: mz_last_error says why);
 * MZ_ERR_BUSY (already watching: stop first; a watch that ended on its source's error no longer
 * counts and is replaced); or the OS error arming the source. */
int mz_pool_pressure_watch_start(mz_pool* pool, const struct mz_pressure_params* params);
/* Stops the pool's watcher (joins its thread). MZ_OK, also when none runs; mz_pool_free stops it. */
int mz_pool_pressure_watch_stop(mz_pool* pool);

/* As mz_decode / mz_restore_generate, within the conversation (then the pool enforces its budget).
 * On failure the conversation is unchanged. */
int mz_conversation_decode(mz_conversation* conv, const mz_token* tokens, int32_t n, bool all_logits);
int mz_conversation_restore_generate(mz_conversation* conv, const mz_token* tokens, int32_t n,
                                     const struct mz_restore_params* params, struct mz_restore_stats* stats);
/* Logits row i of the conversation's last call (n_vocab floats), or NULL. Valid until its next call. */
const float* mz_conversation_logits(mz_conversation* conv, int32_t i);
mz_token mz_conversation_sample(mz_conversation* conv, mz_sampler* s, int32_t i);
int32_t mz_conversation_n_tokens(mz_conversation* conv);
int mz_conversation_truncate(mz_conversation* conv, int32_t n_keep);
/* Since 0.17: the conversation's turn mark (see mz_context_set_turn_mark), set during a turn
 * before its commit: persisted with the conversation (and its remote copy), so that after a
 * restart, or on another server of a fleet, mz_pool_conversation_turn_mark gives it back.
 * MZ_ERR_INVALID_ARG unless 0 <= n <= its tokens, or once it is closed or deleted. */
int mz_conversation_set_turn_mark(mz_conversation* conv, int32_t n);
/* The end of a turn: the conversation is persisted (in the background with write_behind). Since
 * 0.13 it also ends the turn for the budget: a conversation is in use (spared by the budget pass
 * while two or more are) from a restore_generate or a one-token decode until its commit, or until
 * it has been idle write_behind_idle_ms (mz_pool_batch_report.in_use). */
int mz_conversation_commit(mz_conversation* conv);
/* Since 0.13: stops the call running on conv (another thread's mz_conversation_decode or
 * restore_generate) at its next batch step: that call returns MZ_ERR_CANCELLED and the
 * conversation is as before it; the other conversations in the batch go on undisturbed. A call
 * that starts afterwards is not affected; without batching the call runs to its end. Never waits;
 * any thread. MZ_OK, or MZ_ERR_INVALID_ARG for NULL. */
int mz_conversation_cancel(mz_conversation* conv);

struct mz_conversation_report {
  char id[132];
  int32_t n_tokens;
  bool open;                    /* has memory (any tier) in this process; false: stored only */
  bool busy;                    /* a call runs on it: figures are the last known */
  uint64_t kv_resident;         /* bytes of KV in RAM */
  uint64_t kv_mem_compressed;   /* bytes of its in-memory swap */
  uint64_t kv_storage;          /* bytes of its KV on storage (swap file, or the stored file it was opened from) */
  uint64_t stored_bytes;        /* its stored file */
  int32_t stored_tokens;        /* tokens the stored file holds (what a restart finds) */
  uint64_t last_use_unix_ms;
  int32_t shared_chunks;        /* full chunks per layer reused from another conversation */
};
int mz_pool_conversation_report(mz_pool* pool, const char* id, struct mz_conversation_report* out);
/* Writes up to cap reports (out may be NULL with cap 0) and returns how many conversations there
 * are (or a negative status). */
int32_t mz_pool_list(mz_pool* pool, struct mz_conversation_report* out, int32_t cap);

struct mz_pool_report {
  int32_t n_conversations, n_open, n_damaged;
  uint64_t weights_total, weights_resident;
  uint64_t kv_resident, kv_mem_compressed, kv_storage;
  uint64_t in_memory;           /* weights_resident + kv_resident + kv_mem_compressed */
  uint64_t stored_bytes;
  uint64_t memory_budget, disk_budget;
  uint64_t conversations_lost;  /* deleted by the disk budget */
  uint64_t persists, persist_failures;
  uint64_t prefix_chunks_reused;
  uint64_t evictions, bytes_evicted;
};
int mz_pool_get_report(mz_pool* pool, struct mz_pool_report* out);
/* The token history of conversation id (since 0.10): an open conversation's, or a stored one's
 * (read from its stored file's header and index; nothing is loaded into memory). Writes up to cap
 * tokens to out (out may be NULL with cap 0) and returns the full count, or a negative status:
 * MZ_ERR_INVALID_ARG (NULL pool or id, negative cap, no such conversation), MZ_ERR_BUSY (a call
 * runs on it: it is not waited for; ask again after), MZ_ERR_CORRUPT / MZ_ERR_IO (its stored file
 * cannot be read; opening it would report the same). A server that receives whole histories
 * (OpenAI's chat API) uses it to find the conversation a request continues. */
int32_t mz_pool_conversation_tokens(mz_pool* pool, const char* id, mz_token* out, int32_t cap);
/* Since 0.17: conversation id's turn mark into *out (-1: none), an open conversation's or its
 * stored file's (read when the pool opened or last wrote it: no file is read here). MZ_OK;
 * MZ_ERR_INVALID_ARG (NULL argument, no such conversation), MZ_ERR_BUSY (a call runs on it). */
int mz_pool_conversation_turn_mark(mz_pool* pool, const char* id, int32_t* out);
/* Shared prefix chunks (since 0.10): a full chunk (256 tokens, all layers) that several
 * conversations start with is held once in the pool's store, reference-counted, borrowed by each
 * of them and freed when the last one lets it go (truncated before it, closed, deleted). Since
 * then mz_pool_report's kv_resident / kv_mem_compressed / kv_storage and mz_conversation_report's
 * kv_* figures count a conversation's own chunks only, and in_memory adds resident_bytes below
 * once. An output struct, frozen like the others. */
struct mz_pool_shared_report {
  int32_t chunks;            /* distinct shared chunks held */
  int32_t units;             /* (chunk, layer) units held */
  uint64_t resident_bytes;   /* their RAM, once for every borrower (part of in_memory) */
  uint64_t storage_bytes;    /* units evicted to the store's swap file (while nobody uses them) */
  uint64_t refs;             /* references: borrowing (conversation, chunk, layer) slots */
  uint64_t bytes_if_copied;  /* refs x chunk bytes: what a copy per conversation would take */
};
int mz_pool_get_shared_report(mz_pool* pool, struct mz_pool_shared_report* out);
/* Shared chunks stored once (since 0.11): a stored conversation whose first chunks are shared
 * names them instead of holding them, and each such chunk lives once in <dir>/chunks/, written
 * before the first stored file that names it and removed after the last one naming it is replaced
 * or deleted (rebuilt at open; files nobody names are removed then, unless a stored file could not
 * be read: it may name them). A chunk file found missing or damaged, when a conversation naming it
 * opens or when a generation reads it: that conversation's tokens are computed again and the call
 * succeeds (mz_pool_damaged lists it), never a wrong chunk; the file is written again by the next
 * persist that names its chunk. Since 0.11 mz_pool_report.stored_bytes
 * counts the chunk files once, and mz_conversation_report.stored_bytes its own file only. An
 * output struct, frozen like the others. */
struct mz_pool_stored_report {
  int32_t chunk_files;           /* shared chunks stored once */
  uint64_t chunk_file_bytes;     /* their bytes */
  uint64_t chunk_file_refs;      /* stored conversations naming them, summed over the files */
  uint64_t chunk_files_damaged;  /* named chunk files found missing or damaged (each once) */
};
int mz_pool_get_stored_report(mz_pool* pool, struct mz_pool_stored_report* out);
/* The load arena and the write-behind (since 0.12). An output struct, frozen like the others. */
struct mz_pool_io_report {
  uint64_t arena_bytes;          /* held by the load arena now (part of in_memory) */
  uint64_t arena_cap;            /* its cap (mz_pool_params.load_arena_bytes, resolved) */
  uint64_t arena_reused_bytes;   /* segments loads took from it instead of mapping fresh memory */
  double persist_yielded_s;      /* time background writes waited for first tokens elsewhere */
  int32_t unsaved;               /* conversations whose last change is not stored yet */
};
int mz_pool_get_io_report(mz_pool* pool, struct mz_pool_io_report* out);
/* The shared forward pass and the conversations in use (since 0.13; frozen like the others). */
struct mz_pool_batch_report {
  bool batching;                 /* mz_pool_params.batch */
  uint64_t steps;                /* forward passes run */
  uint64_t seq_slots;            /* conversations summed over steps (seq_slots / steps: mean batch) */
  uint64_t tokens;               /* tokens computed */
  uint64_t prefill_tokens;       /* of them, prompt tokens */
  uint64_t cancelled;            /* calls stopped by mz_conversation_cancel */
  int32_t max_batch;             /* most conversations in one step */
  uint64_t compute_buffer_bytes; /* the pass's compute buffers (part of the memory budget) */
  int32_t in_use;                /* conversations in use now: a call runs, or its turn is open
                                    (generated since its last commit, last call within
                                    write_behind_idle_ms) */
  uint64_t budget_spared_in_use; /* budget passes that stopped before the conversations in use
                                    (two or more mid-turn: none of them, nor the weights, is taken
                                    by a budget pass; mz_pool_evict and pressure still take them) */
};
int mz_pool_get_batch_report(mz_pool* pool, struct mz_pool_batch_report* out);
/* Since 0.14: one conversation's memory given back, or brought back, on request (a server's
 * POST /v1/conversations/ID/evict and /restore).
 * mz_pool_evict_conversation: all of conversation id's KV in RAM (resident and its in-memory
 * swap) goes to the tiers its eviction policy chooses (an idle conversation goes out whole), and
 * its borrowed shared chunks are let go. Never waits for a call on it: MZ_ERR_BUSY while one runs
 * (part may have moved: *freed says); it may wait while another call brings weights back. MZ_ERR_INVALID_ARG: NULL pool or id, no such conversation.
 * A conversation that is stored only has nothing in RAM: MZ_OK, *freed 0. *freed optional.
 * mz_pool_restore_conversation: brings its KV back into RAM, after any weights the pool gave back
 * (a stored-only conversation is opened first, as mz_pool_open). MZ_ERR_BUSY at once while a call
 * runs on it, or while weights must come back and a generation is running (it restores what it
 * needs itself); MZ_ERR_INVALID_ARG: no such conversation (none is created); a read error of its
 * data (MZ_ERR_IO, MZ_ERR_CORRUPT). The memory budget still applies after it: with a budget too
 * small for it, a budget pass may give part of it back again. *restored (optional): RAM brought
 * back. Thread-safe as every pool function. */
int mz_pool_evict_conversation(mz_pool* pool, const char* id, uint64_t* freed);
int mz_pool_restore_conversation(mz_pool* pool, const char* id, uint64_t* restored);
/* Since 0.14: evictions by what asked for them, counted since the pool was created. A pass that
 * gave back nothing is not counted (budget) or counted with 0 bytes (the others; an
 * mz_pool_evict_conversation on a conversation with nothing in memory is not counted). The "budget"
 * figures are the memory budget's passes; "pressure" the pressure watch's events; "trim"
 * mz_pool_on_trim_memory's; "manual" mz_pool_evict's; "conversation"
 * mz_pool_evict_conversation's. An output struct, frozen like the others. */
struct mz_pool_event_report {
  uint64_t evict_budget, evict_budget_bytes;
  uint64_t evict_pressure, evict_pressure_bytes;
  uint64_t evict_trim, evict_trim_bytes;
  uint64_t evict_manual, evict_manual_bytes;
  uint64_t evict_conversation, evict_conversation_bytes;
  uint64_t pressure_events;      /* events from the pressure watch (merged ones included) */
  uint64_t trim_events;          /* mz_pool_on_trim_memory calls with a level that asks for memory */
  uint64_t restored_ahead_bytes; /* brought back by the watch's restore-ahead */
  uint64_t conversation_restores, conversation_restored_bytes; /* mz_pool_restore_conversation */
  uint64_t recomputed;           /* conversations computed again: a stored copy failed verification */
};
int mz_pool_get_event_report(mz_pool* pool, struct mz_pool_event_report* out);
/* The remote tier (since 0.15; mz_pool_params.remote_url). An output struct, frozen like the others. */
struct mz_pool_remote_report {
  bool enabled;                  /* a remote tier is configured */
  bool degraded;                 /* its last call failed (Redis unreachable): local tiers only */
  int32_t pending;               /* conversations whose latest stored state is not in Redis yet */
  uint64_t manifests_written, chunks_written;
  uint64_t chunks_present;       /* chunks found already written (by this or another server) */
  uint64_t bytes_written, write_failures;
  uint64_t manifest_hits, manifest_misses;
  uint64_t chunks_fetched, bytes_fetched;
  uint64_t damaged;              /* values that failed verification or were gone: computed again */
  uint64_t prefix_chunks;        /* chunks found by chain hash for new conversations */
  double fetch_s;                /* time spent fetching (bytes_fetched / fetch_s: its rate) */
  char address[128];             /* redis://host:port (never the password) */
  char last_error[256];
};
int mz_pool_get_remote_report(mz_pool* pool, struct mz_pool_remote_report* out);
/* Since 0.19: what became of the prefixes an empty conversation's first call found in Redis by
 * chain hash: fetched (streamed in, or whole with remote_prefix_whole), or not fetched because
 * computing their tokens again was expected to be faster (the device profile's remote read rate,
 * else the rate learned from earlier fetches, against the measured prefill rate; docs/fleet.md).
 * An output struct, frozen like the others. MZ_ERR_INVALID_ARG for NULL; all 0 without a remote tier. */
struct mz_pool_remote_fetch_report {
  uint64_t prefix_chunks;          /* chunks found by chain hash and fetched (as mz_pool_remote_report's) */
  uint64_t fetches_skipped_slower; /* prefixes found and not fetched: computing them was expected faster */
  uint64_t chunks_skipped_slower;  /* the chunks of those prefixes */
  int32_t streaming;               /* chunks being streamed in now (by id or by chain hash) */
};
int mz_pool_get_remote_fetch_report(mz_pool* pool, struct mz_pool_remote_fetch_report* out);
/* Since 0.15: mz_pool_flush, then tries every pending remote write now and waits for it: MZ_OK,
 * or the store's error (MZ_ERR_IO: unreachable; the writes are kept and retried). MZ_OK without
 * a remote tier. */
int mz_pool_flush_remote(mz_pool* pool);
/* Damaged stored file i (0-based) found when the pool opened: "path: error" into buf (truncated to
 * cap-1 bytes). Returns the full length, or MZ_ERR_INVALID_ARG past the last one. */
int32_t mz_pool_damaged(mz_pool* pool, int32_t i, char* buf, int32_t cap);

/* ---- several models, one memory budget (since 0.15) ----
 * Each model has its own pool (its conversations, its folder, its forward pass); pools created
 * with the same mz_budget (mz_pool_params.shared_budget) share its memory_budget. Whenever they
 * hold more than it together (after a generation call on any of them), or pressure asks
 * (mz_pool_on_trim_memory or the pressure watch of any of them, mz_budget_on_trim_memory,
 * mz_budget_evict), memory is given back across the pools in this order:
 *   1. idle models' conversations, least recently used model first, each conversation out whole
 *      (an idle model: no conversation of it in use: mid-turn or computing);
 *   2. idle models' weights, least recently used model first, each back to front (later layers
 *      first), only while nothing of that model computes;
 *   3. the models in use, least recently used first, each in its own pool's order.
 * A model whose weights were given back returns as a single pool's do: its next generation
 * (mz_conversation_restore_generate) restores them front layers first, overlapped with that
 * request's prefill. A conversation keeps its model: its pool's folder holds it, and its stored
 * file names the model's fingerprint (another model's file is damaged, never read as its own).
 * Thread-safety: every function may be called from any thread. */
typedef struct mz_budget mz_budget;
struct mz_budget_params {
  uint32_t struct_size;         /* set by mz_budget_default_params() */
  uint64_t memory_budget;       /* RAM for every pool naming it (weights, KV, in-memory swap,
                                   compute buffers); 0: none (only pressure and mz_budget_evict take) */
  /* since 0.19 */
  bool pass_after_return;       /* the budget pass after a generation call runs on the budget's own
                                   thread once the call has returned its logits, not inside it
                                   (default true). Guaranteed either way: before a call restores
                                   anything, idle models give back for what it will bring back, so
                                   every restore starts within the budget. With it, between a
                                   call's return and the end of its pass the pools may hold more
                                   than the budget by what the call grew (its prompt's KV, compute
                                   buffers allocated again); mz_budget_settle waits for that pass,
                                   whose errors are not the call's. false: inside the call (the
                                   call returns its error), as before 0.19 */
  bool spread_idle_weights;     /* step 2 of the order below across idle models: false (default)
                                   the least recently used model's weights first, back to front,
                                   before the next idle model's; true: one layer at a time from the
                                   idle model keeping the largest share of its layers, so every
                                   idle model keeps the same front share (an ablation, bench
                                   models' mzcache-spread) */
  bool room_behind;             /* the room pass before a call's restore (idle models giving back
                                   for what it will bring back) handed to the budget's thread, so
                                   the restore starts at once; the pools may then hold above the
                                   budget by what that pass has yet to give back until it ends
                                   (mz_budget_settle waits for it). false (default): inside the
                                   call, every restore starts within the budget. With
                                   pass_after_return only. An ablation (bench models'
                                   mzcache-behind): not shown to help on 2 cores */
};
struct mz_budget_params mz_budget_default_params(void);
int mz_budget_new(const struct mz_budget_params* params, mz_budget** out);
/* Releases the handle. Pools created with it keep the budget itself alive (and keep sharing it)
 * until they are freed. NULL: no-op. */
void mz_budget_free(mz_budget* budget);
/* Gives back at least bytes of RAM (or all it can: UINT64_MAX) across the pools in the order
 * above; never what is computing. *freed (optional). */
int mz_budget_evict(mz_budget* budget, uint64_t bytes, uint64_t* freed);
/* Android's onTrimMemory levels (as mz_pool_on_trim_memory) for every pool together: the amount
 * policy's share of their memory together, given back in the order above. *freed (optional). */
int mz_budget_on_trim_memory(mz_budget* budget, int32_t level, uint64_t* freed);
/* An output struct, frozen like the others. */
struct mz_budget_report {
  uint64_t memory_budget;
  uint64_t in_memory;           /* every pool's RAM together (the figures its budget counts) */
  int32_t n_pools;
  uint64_t passes, bytes_evicted;  /* passes that gave back something; all bytes given back */
  uint64_t idle_model_kv_bytes;    /* step 1: idle models' conversations */
  uint64_t idle_model_weight_bytes;/* step 2: idle models' weights */
  uint64_t active_model_bytes;     /* step 3: models in use */
  uint64_t pressure_events, pressure_bytes; /* trim / pressure events applied across the pools */
  uint64_t evict_calls, evict_bytes;        /* mz_budget_evict */
};
int mz_budget_get_report(mz_budget* budget, struct mz_budget_report* out);
/* Since 0.19: waits until the budget pass after every call that returned before this one has run
 * (mz_budget_params.pass_after_return; at once without it). */
int mz_budget_settle(mz_budget* budget);
/* Since 0.19: what a pooled conversation's last successful generation call
 * (mz_conversation_restore_generate or _decode) spent besides its restore and compute, in a shared
 * budget: the room pass before its restore (idle models giving back for what it brings back) and
 * the budget pass after it when that ran inside the call (0 when it ran on the budget's thread:
 * pass_after_return, or in another call of the same batch step). An output struct, frozen like the
 * others. */
struct mz_call_report {
  double room_s;                /* the room pass's seconds */
  uint64_t room_bytes;          /* what it gave back */
  double pass_s;                /* the pass after the call, inside it */
};
int mz_conversation_get_call_report(mz_conversation* conv, struct mz_call_report* out);

/* Since 0.15: a pool's weights by tier, for a report per model: resident (in RAM, as the pool
 * holds them), given back but still in the page cache (a restore finds them without reading
 * storage), and given back and gone from it (a restore reads storage). Bytes of the weight units'
 * regions (dropped_cached: of their file runs). */
struct mz_pool_weights_report {
  uint64_t total, resident, dropped;
  uint64_t dropped_cached;      /* of dropped: still in the page cache */
  int32_t units, units_resident;
  int64_t last_use_unix_ms;     /* the newest call on any conversation of this pool (0: none) */
  bool in_use;                  /* a conversation is mid-turn or computing */
};
int mz_pool_get_weights_report(mz_pool* pool, struct mz_pool_weights_report* out);
/* Since 0.15: a text of the model (what llama-server's /props reports): its GGUF
 * tokenizer.chat_template ("" without one), the BOS or EOS token's text ("" if the vocabulary has
 * none). Copies at most cap-1 bytes and a NUL into buf; returns the full length (call with cap 0
 * to size the buffer), or MZ_ERR_INVALID_ARG (NULL model, unknown what, cap < 0, buf NULL with
 * cap > 0). Thread-safe. */
enum { MZ_MODEL_TEXT_CHAT_TEMPLATE = 0, MZ_MODEL_TEXT_BOS = 1, MZ_MODEL_TEXT_EOS = 2 };
int32_t mz_model_get_text(const mz_model* model, int32_t what, char* buf, int32_t cap);
/* Checks that the model file is still the one loaded (size, modification time, inode and header):
 * MZ_ERR_MODEL_CHANGED with the reason otherwise (a server refuses requests for it rather than
 * serve from a mix of old and new layers). Reads the file's header. Thread-safe. */
int mz_model_verify_file(mz_model* model);

#ifdef __cplusplus
}
#endif
#endif /* MZCACHE_H */
