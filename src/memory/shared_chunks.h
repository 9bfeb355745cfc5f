// SharedChunkStore: full KV chunks held once for many contexts (a pool's shared prefixes).
//
// A shared chunk is a full chunk of T tokens named by its chained hash (pool/chunk_hash.h: model,
// parent hash, the chunk's tokens); each of its layers is one unit of the store. A full chunk is
// immutable (a context only appends after it), which is what makes holding it once safe. Contexts
// borrow units (UnitTable::AdoptShared / ShareChunk): a borrowing slot holds one reference, and
// while its chunk pointer is installed in the context's KvCache (the slot "attached", state
// kResident) it also holds one pin.
//
// Ownership, one owner per concern: this store alone changes a shared unit's state (resident, on
// the store's own storage, lost) and frees it; the borrowing context's UnitTable alone changes its
// slot (attached / detached, state kKvShared). A unit leaves when its last reference is released
// (the last conversation using it truncated before it, deleted, closed or destroyed): its memory
// and stored copy are freed then, never before.
//
// Pins are the read lock: compute reads only attached slots, every attached slot holds a pin, and
// Evict takes only units with no pin (a try-lock per unit: it never waits for a generation). A
// pinned unit is never moved or freed, so a generation reading it needs no other lock.
//
// Tiers: resident (an Env mapping of chunk_bytes()) or on the store's own storage (one swap file,
// encoded by the store's codec; Evict), or in the chunk's durable chunk file (AdoptFile: a pool's
// stored shared prefix; Evict of a unit that has one writes nothing). Pin brings an evicted unit back (read, checksum verified,
// decoded); a unit whose stored copy fails verification is marked lost, and every later Pin / Read
// of it returns kCorruption (never a wrong chunk): its borrowers report kCorruption for it as for
// any lost chunk.
//
// Figures (Report) count every unit once, however many contexts borrow it: the bytes it holds in
// RAM and on storage, and what copies would hold (references x chunk bytes).
//
// Thread-safety: every method is thread-safe (one mutex). Pin (a restore) and Evict do their I/O
// under it, so they serialize with each other; the mutex is never held while calling out (no lock
// order with contexts: a context may call the store under its own lock, the store calls nobody).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "env/env.h"
#include "memory/kv_cache.h"
#include "store/kv_codec.h"
#include "store/swap_file.h"

namespace mz {

struct SharedChunkOptions {
  std::string codec = "q8";  // encoding of units evicted to the store's storage ("none": lossless)
  std::string swap_path;     // the store's swap file (created on first eviction); required
  bool direct_io = true;
};

struct SharedChunkReport {
  int chunks = 0;                 // distinct shared chunks (hashes) with at least one unit
  int units = 0;                  // (chunk, layer) units held
  int units_resident = 0, units_stored = 0, units_lost = 0;
  uint64_t resident_bytes = 0;    // RAM held once for every borrower
  uint64_t storage_bytes = 0;     // the store's swap file (encoded units)
  uint64_t file_bytes = 0;        // units' payloads in chunk files (durable copies, AdoptFile)
  int units_file_only = 0;        // units held only in a chunk file (counted in units_stored)
  uint64_t refs = 0;              // references over all units (borrowing slots)
  uint64_t pins = 0;              // attached slots
  uint64_t bytes_if_copied = 0;   // refs x chunk bytes: what each borrower holding a copy would take
};

class SharedChunkStore {
 public:
  struct Unit;
  using Ref = Unit*;  // one reference to one unit (owned by whoever received it: release it once)

  SharedChunkStore(Env* env, const KvGeometry& g, const SharedChunkOptions& o);
  // REQUIRES: no reference left (every borrowing table released its own; a pool destroys its
  // conversations first). Frees what is left regardless.
  ~SharedChunkStore();
  // Validates the codec. Call once before use.
  Status Init();
  const KvGeometry& geometry() const { return g_; }

  // Unit `layer` of the chunk named hash, confirmed by its parent hash and its T tokens (a
  // different chunk under the same hash is never returned): a new reference, or nullptr if the
  // store does not hold it (or it is lost).
  Ref Find(uint64_t hash, uint64_t parent, const int32_t* tokens, int layer);
  // Adds unit `layer` of chunk hash (index: its place in the chain, 0 = first; used to evict rear
  // chunks first) with data, an Env mapping of chunk_bytes() holding its resident form; ownership
  // of data is taken in every case. If the unit exists already (another borrower added it
  // meanwhile), data is freed and a reference to the existing one is returned.
  // kInvalidArgument if hash names a chunk of other tokens or another parent (a collision: do not
  // share it), or a unit marked lost that borrowers still hold.
  Status Insert(uint64_t hash, uint64_t parent, const int32_t* tokens, int index, int layer, uint16_t* data, Ref* out);
  // Where unit l of a chunk lies in a chunk file (runtime/session_file.h, SaveChunkFile), as
  // SessionReader::ChunkPlace gives it: offset (4096-aligned), payload bytes, payload xxh64.
  struct FilePlace {
    uint64_t off = 0, size = 0, hash = 0;
  };
  // The chunk named hash (parent, tokens, index as for Insert) has a durable copy: the chunk file
  // at path, unit l at places[l], encoded by codec (the file's; opened read-only through the Env,
  // held by each unit that takes it until that unit leaves the store). Each unit without a durable
  // copy takes this one as its stored form (one that has one keeps it, with the file it was opened
  // from: a file written again at the same path is another file): Evict then
  // frees its RAM without writing, and a unit on no other tier is read from the file (checksum
  // verified; a mismatch marks it lost). refs (optional): one new reference per layer, refs[l],
  // creating the units that are absent (held only in the file until first pinned). Checks first:
  // kInvalidArgument for a collision (hash names other tokens or another parent), a lost unit,
  // an unknown codec or a wrong count of places; the Env's error opening the file. On error
  // nothing changed and no reference was taken.
  // gen: the caller's name for this file (reported back by TakeLostFiles). replace: every unit
  // takes this file as its durable copy, also one that had another (a chunk file written again).
  Status AdoptFile(uint64_t hash, uint64_t parent, const int32_t* tokens, int index, const std::string& path,
                   const std::string& codec, const std::vector<FilePlace>& places, std::vector<Ref>* refs,
                   uint64_t gen = 0, bool replace = false);
  // A chunk file may still be arriving (a pool's remote tier streams its layers in from the
  // fleet's store while the restore runs, pool/remote_tier.h). gate(hash, gen, layer), when set,
  // is called before unit `layer` of the chunk named hash is read from its chunk file (file gen as
  // AdoptFile's), without the store's mutex held: it returns once that layer's bytes are in the
  // file (Ok), or with an error when they will never be (the fetch failed or a check did): the
  // unit is then marked lost (its readers get kCorruption and compute it again, never a wrong
  // chunk). A unit resident or on the store's own swap never calls it. Set before the first
  // AdoptFile of such a file; thread-safe.
  using FileGate = std::function<Status(uint64_t hash, uint64_t gen, int layer)>;
  void SetFileGate(FileGate gate);
  // True if the chunk named hash is held and has a chunk file (AdoptFile).
  bool HasFile(uint64_t hash) const;
  // The chunk files a unit of which failed verification when read since the last call (each once):
  // the chunk's hash and the file's gen (AdoptFile). The file is damaged: the pool's to deal with.
  struct LostFile {
    uint64_t hash = 0, gen = 0;
    bool operator==(const LostFile& o) const { return hash == o.hash && gen == o.gen; }
  };
  std::vector<LostFile> TakeLostFiles();
  void AddRef(Ref r);
  // Drops one reference; the last one frees the unit (memory, stored copy). REQUIRES: not pinned by
  // this reference's holder (Unpin first).
  void Release(Ref r);
  // Pins r in RAM and returns its memory (valid until the matching Unpin): an evicted unit is read
  // back from the store's storage and verified first. kCorruption (lost: its stored copy failed
  // verification; marked so for good), kIOError, kNoMemory; on error nothing is pinned.
  Status Pin(Ref r, uint16_t** out);
  void Unpin(Ref r);
  // Copies r's resident form (chunk_bytes()) into dst whatever its tier (states unchanged; a
  // stored copy is read and decoded into dst). Errors as Pin.
  Status Read(Ref r, uint16_t* dst);
  // Moves unpinned resident units to the store's storage (encoded by the codec), rear chunks
  // first, until at least `bytes` of RAM are freed or none is left: *freed. Pinned units (a
  // borrower attached: possibly computing) are skipped, never waited for. On a write error
  // (ENOSPC, EIO) the unit stays resident and the error is returned with what was freed so far.
  Status Evict(uint64_t bytes, uint64_t* freed);
  SharedChunkReport Report() const;

 private:
  struct Chunk;
  Status EnsureSwap();
  // REQUIRES mu_. Brings u back into RAM (verified); sets u.mem.
  Status LoadLocked(Unit& u);
  // REQUIRES mu_, u not resident. Decodes u's stored copy (its swap extent, else its chunk file)
  // into dst, verified; a checksum mismatch marks u lost.
  Status ReadStoredLocked(Unit& u, uint16_t* dst);
  // The gate of u's chunk file (SetFileGate) when u would be read from it; its error marks u lost.
  Status AwaitFile(Unit& u);
  ChunkShape Shape(int layer) const;
  // REQUIRES mu_. u's chunk file copy can stand for its evicted form (same codec as the store's).
  bool Durable(const Unit& u) const;
  void FreeUnitLocked(Unit& u);

  Env* env_;
  KvGeometry g_;
  SharedChunkOptions opts_;
  std::unique_ptr<KvCodec> codec_;
  mutable std::mutex mu_;
  std::unique_ptr<SwapFile> swap_;
  using ChunkMap = std::unordered_map<uint64_t, std::unique_ptr<Chunk>>;
  // REQUIRES mu_, hash not held. A chunk with every unit absent (refs 0).
  ChunkMap::iterator NewChunkLocked(uint64_t hash, uint64_t parent, const int32_t* tokens, int index);
  ChunkMap chunks_;  // hash -> chunk
  std::vector<LostFile> lost_files_;  // TakeLostFiles (under mu_)
  FileGate gate_;                     // SetFileGate (under mu_; called without it)
};

}  // namespace mz
