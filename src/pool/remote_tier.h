// RemoteTier: a pool's fourth tier (after memory, compressed memory and local storage), in a
// key-value store shared by a fleet of servers (Redis: store/remote_kv.h), so that any server
// continues any conversation and a shared prefix is stored once for the whole fleet.
//
// Key layout (fp: the model's fingerprint, FileIdentity::header_hash, 16 hex digits; codec: the
// stored codec's name; the part in braces is the Redis Cluster hash tag, so every key has a slot of
// its own and the tier only ever sends single-key commands):
//   mz:<fp>:<codec>:k:{<hash>}  a full chunk (T tokens, every layer) under its chain hash
//                               (pool/chunk_hash.h): written once for the whole fleet (SET NX)
//   mz:<fp>:m:{<id>}            conversation id's manifest: its tokens, codec and model, the chunks it
//                               names (all its full chunks, by the chain hashes of its tokens) and
//                               its tail (the partial last chunk's payloads)
// Every value is an envelope: magic "MZRB0001", kind (chunk / manifest), the model fingerprint,
// xxh64 of the key it was written under, the payload's length and xxh64, then the payload, which is
// a session file's bytes (runtime/session_file.h: a chunk file for a chunk, a version-2 session
// naming every full chunk for a manifest) with its own checksums. A value is never trusted: a
// missing key (Redis evicted it: maxmemory LRU), a bad envelope (bit flip, truncation, another
// model's or another key's value) or a payload failing the session file's checks is a miss, counted
// in RemoteTierStats::damaged; the pool then computes those tokens again. Never a wrong chunk.
//
// Reclaim: by time to live, refreshed. Every key is written with ttl_s; each write of a manifest
// refreshes the TTL of every chunk it names (after the manifest's own), and each fetch refreshes
// the manifest and its chunks. A chunk no live manifest names stops being refreshed and expires
// within ttl_s. Not reference counts: counts across a fleet need atomic multi-key updates (a Lua
// script, which Redis Cluster refuses across slots), are left wrong by a server killed between two
// steps and by Redis evicting a count or a manifest under maxmemory, and a wrong count deletes a
// live chunk or leaks one forever. TTLs are crash-safe and self-healing; their cost is space held
// up to ttl_s after the last use, and a conversation idle longer than ttl_s is gone from Redis (the
// server that wrote it still holds it on its disk).
//
// Writes are behind: QueueWrite (after the local persist of the conversation) hands the id to the
// tier's thread, which reads the stored file (and the chunk files it names) and writes the chunks
// Redis lacks (one pipelined EXISTS first), then the manifest. A turn never waits for it. While the
// store cannot be reached the tier is degraded (Stats().degraded), keeps the ids (the latest file
// of each is written when it comes back: retried every retry_ms, or at once by Flush) and the pool
// goes on with its local tiers. Lookups are skipped while degraded (a miss at once, rather than a
// connect timeout per request); the thread pings the store every retry_ms until it answers.
//
// Thread-safety: every method may be called from any thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "memory/kv_cache.h"
#include "memory/shared_chunks.h"
#include "store/remote_kv.h"

namespace mz {

class Model;
class SessionReader;

struct RemoteTierOptions {
  // redis://[user[:password]@]host:port[/db], or rediss://... (TLS: store/tls_stream.h); empty: no
  // remote tier.
  std::string url;
  // rediss:// only: the CAs to trust (PEM; empty: the system's), and a client certificate and its
  // key (PEM, both or neither) for a Redis with tls-auth-clients. Read at Open (through the
  // model's Env): an unreadable or bad file fails it, as a CA file with a redis:// URL does.
  std::string ca_file, cert_file, key_file;
  // A file holding the password (its first line; the URL's user is the ACL user). Read at Open:
  // an unreadable file fails it.
  std::string password_file;
  uint32_t timeout_ms = 2000;        // connect and each reply
  uint32_t ttl_s = 7 * 24 * 3600;    // every key's time to live, refreshed by writes and fetches
  uint32_t retry_ms = 1000;          // degraded: the pending writes are tried again this often
  int connections = 4;
  // A new conversation's prefix found by chain hash (Pool::RemotePrefix): streamed in, front layers
  // first, overlapped with the prefill, as a conversation opened by id (true, the default); false:
  // fetched whole and verified before the prefill starts (the peer it is measured against).
  bool stream_prefix = true;
  // Tests: this store instead of connecting to url (a FakeRemoteKv, or a RedisKv of theirs).
  std::shared_ptr<RemoteKv> store;
};

struct RemoteTierStats {
  bool enabled = false;
  bool degraded = false;         // the last call to the store failed (it could not be reached)
  std::string address;           // the store's address (no password)
  std::string last_error;
  int pending = 0;               // conversations whose latest stored file is not in the store yet
  uint64_t manifests_written = 0, chunks_written = 0, chunks_present = 0;  // present: another wrote it
  uint64_t bytes_written = 0, write_failures = 0;
  uint64_t manifest_hits = 0, manifest_misses = 0;
  uint64_t chunks_fetched = 0, bytes_fetched = 0;
  uint64_t damaged = 0;          // values that failed verification (or named chunks missing)
  uint64_t prefix_chunks = 0;    // chunks found by chain hash for a new conversation
  int streaming = 0;             // chunks being streamed in now (StreamChunks), whole ones not counted
  double fetch_s = 0;            // time spent fetching (bytes_fetched / fetch_s: the tier's rate)
  // Prefixes found by chain hash and not fetched: computing their tokens again was expected to be
  // faster (policy/remote_fetch.h; Pool::RemotePrefix), and the chunks that were not fetched.
  uint64_t fetches_skipped_slower = 0, chunks_skipped_slower = 0;
};

class RemoteTier {
 public:
  enum Kind : uint32_t { kChunk = 1, kManifest = 2 };
  // chunk_path(hash): where the pool keeps that chunk's local chunk file (a stored file's named
  // chunks are read from there). The store is not contacted here: a store down at start makes a
  // degraded tier, not an error. Errors: a bad URL, an unreadable password file, an unreadable or
  // bad TLS file (ca_file, cert_file, key_file), a TLS file with a redis:// URL, rediss:// in a
  // build without OpenSSL (kUnsupported).
  static Status Open(const Model& model, int chunk_tokens, const std::string& codec,
                     const RemoteTierOptions& opts, std::function<std::string(uint64_t)> chunk_path,
                     std::unique_ptr<RemoteTier>* out);
  ~RemoteTier();  // stops the thread (a write in progress ends; pending ones are dropped: the local copy stays)

  std::string ChunkKey(uint64_t hash) const;
  std::string ManifestKey(const std::string& id) const;
  // value = envelope(kind, key, payload); Unwrap verifies it (kCorruption naming what is wrong).
  std::string Wrap(Kind kind, const std::string& key, const std::string& payload) const;
  Status Unwrap(Kind kind, const std::string& key, const std::string& value, std::string* payload) const;

  // Write-behind: conversation id's stored file at path goes to the store (its latest content
  // when the thread gets to it).
  void QueueWrite(const std::string& id, const std::string& path);
  // Conversation id was deleted: its pending write is dropped and its manifest removed from the
  // store (best effort: the store down, the manifest stays until its TTL; the chunks it named
  // expire by TTL unless another manifest names them).
  void DeleteConversation(const std::string& id);
  // Tries every pending write now and waits until each was tried: the first error (the store
  // down: kIOError, the ids kept for later).
  Status Flush();

  // The manifest of id: the session file's bytes (verified envelope) in *payload, or empty when
  // the store has none, holds a damaged one (counted) or cannot be reached (degraded). Its TTL is
  // refreshed. Never an error: a miss is what the caller handles.
  void FetchManifest(const std::string& id, std::string* payload);
  // The chunks of hashes (pipelined GETs): (*payloads)[i] the chunk file's bytes, or empty (missing,
  // damaged: counted, unreachable). Their TTLs are refreshed.
  void FetchChunks(const std::vector<uint64_t>& hashes, std::vector<std::string>* payloads);
  // ---- streamed chunks: a conversation restored while its chunks arrive ----
  // The head of each chunk of hashes: the first head_bytes of its chunk file (the session header
  // and index: enough to place the file and open it), and the file's whole length. The envelope is
  // checked as far as the head goes (magic, kind, model, key, and its length against the value's:
  // a truncated value is found here); the payload's own checksums are checked as it arrives
  // (StreamChunks). One pipeline (GETRANGE and STRLEN per key). A miss (missing, damaged: counted;
  // unreachable) leaves (*heads)[i] empty.
  void FetchChunkHeads(const std::vector<uint64_t>& hashes, uint64_t head_bytes, std::vector<std::string>* heads,
                       std::vector<uint64_t>* file_bytes);
  // One chunk file to fill: the chunk named hash, its local file (open for writing, holding the
  // head already, sized to its length), gen (the pool's name for that file: ChunkFile::gen) and
  // where each layer's payload lies (SessionReader::ChunkPlace: offset, bytes, xxh64).
  struct StreamJob {
    uint64_t hash = 0, gen = 0;
    std::unique_ptr<File> file;
    std::vector<SharedChunkStore::FilePlace> layers;
    // Optional, shared by several jobs: the caller's file standing for their chunk files while any
    // may be partial (its sign, for a restart after a crash). Removed through the model's Env once
    // `left` of the jobs holding it arrived whole and synced; kept when one fails or never ends.
    struct Marker {
      std::string path;
      std::atomic<int> left{0};
    };
    std::shared_ptr<Marker> marker;
  };
  // Fills the jobs' files on the tier's stream thread and returns at once: layer 0 of every chunk
  // (one pipelined GETRANGE), then layer 1, and so on, so that a restore (front layers first) uses
  // the first layers while the rest arrives. Each payload is checked against its xxh64 (from the
  // verified index) before it is written and counts as arrived; a chunk whose payload is missing,
  // short or fails its check stops there (counted in damaged): its later layers never arrive and
  // AwaitLayer reports the error, so the pool computes it again. The store unreachable: every
  // chunk of the batch stops so.
  void StreamChunks(std::vector<StreamJob> jobs);
  // Blocks until layer `layer` of the file gen of chunk hash is in its file: Ok (also when this
  // tier streams no such file: it is whole); kCorruption when it never will be (see StreamChunks),
  // or the tier is stopping. Bounded by the store's reply timeout per layer. Thread-safe.
  Status AwaitLayer(uint64_t hash, uint64_t gen, int layer);
  // Chunks being streamed now (tests, reports).
  int Streaming();

  // How many of hashes' first chunks the store holds (pipelined EXISTS), 0 when unreachable.
  int LongestPrefix(const std::vector<uint64_t>& hashes);
  void CountDamaged(uint64_t n = 1);
  void CountPrefix(uint64_t chunks);
  void CountSkippedSlower(uint64_t chunks);  // one prefix of chunks not fetched (slower than computing)

  RemoteTierStats Stats();
  RemoteKv* store() const { return kv_.get(); }

 private:
  RemoteTier() = default;
  void Loop();
  void StreamLoop();
  void StreamBatch(std::vector<StreamJob>& jobs);
  Status WriteOne(const std::string& id, const std::string& path);
  void Note(const Status& st);  // degraded / last_error after a call to the store
  // call (a fetch from the store): its time added to fetch_s, its outcome noted (Note).
  Status TimedFetch(const std::function<Status()>& call);
  // True while degraded: lookups are skipped (a miss at once, not a timeout per request) until
  // the thread's next probe (every retry_ms) or write reaches the store again.
  bool Skip();
  // The chunk file bytes of chunk c of r (its own payloads, or those of its local chunk file).
  Status ChunkBytes(SessionReader& r, int c, uint64_t hash, std::string* out);

  const Model* model_ = nullptr;
  int T_ = 256;
  KvGeometry g_;
  uint64_t fp_ = 0;
  std::string codec_;
  RemoteTierOptions opts_;
  std::function<std::string(uint64_t)> chunk_path_;
  std::shared_ptr<RemoteKv> kv_;

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::map<std::string, std::string> pending_;  // id -> stored path
  std::set<std::string> deleted_;               // deleted while a write pass ran (its manifest removed after)
  bool running_ = false, stop_ = false, retry_now_ = false;
  int running_n_ = 0;                            // writes in the pass running now
  uint64_t attempts_ = 0;                        // write passes ended
  Status last_pass_error_;
  RemoteTierStats stats_;
  std::thread thread_;

  // Streams (StreamChunks): the queue, and per chunk (hash, gen) how many of its leading layers
  // are in its file (-1: failed, with why). A chunk leaves streams_ once whole.
  struct StreamState {
    int arrived = 0;
    std::string why;
  };
  std::mutex st_mu_;
  std::condition_variable st_cv_, arrived_cv_;
  std::vector<std::vector<StreamJob>> st_queue_;
  std::map<std::pair<uint64_t, uint64_t>, StreamState> streams_;
  bool st_stop_ = false;
  std::thread st_thread_;
};

}  // namespace mz
