// RemoteKv: the key-value store behind a pool's remote tier (pool/remote_tier.h), shared by a fleet
// of servers. An interface, so that tests put a fault-injecting fake (FakeRemoteKv) where the Redis
// client (RedisKv) goes.
//
// Contract of every implementation:
//   - Values are opaque bytes; the tier verifies everything it reads (a store may lose, evict,
//     truncate or corrupt any value at any time: a value is a hint, never trusted).
//   - Multi-key calls are pipelined (one round trip for many keys) and answer per key, in order.
//   - A call that cannot reach the store returns kIOError (connection refused, timeout, a server
//     error): the tier then reports itself degraded and goes on without it. Nothing throws.
//   - Thread-safe: calls may come from any thread at once (a connection pool).
#pragma once
#include <cstdint>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace mz {

class Env;

class RemoteKv {
 public:
  virtual ~RemoteKv() = default;
  // Values of keys, in order (nullopt: no such key). Pipelined.
  virtual Status Get(const std::vector<std::string>& keys, std::vector<std::optional<std::string>>* values) = 0;
  // Byte ranges of values: (*values)[i] the bytes [ranges[i].first, ranges[i].first +
  // ranges[i].second) of keys[i] (GETRANGE): shorter, or empty, when the value is (a missing key
  // reads as empty, as Redis answers). sizes (optional): each whole value's length (STRLEN; 0 for a
  // missing key), in the same pipeline. Pipelined: one round trip for every key. The strings
  // *values holds on entry may lend their buffers to the new values (RedisKv does: a caller that
  // passes the same vector again, as the stream does layer after layer, reads into memory it
  // already has instead of faulting in new pages).
  virtual Status GetRange(const std::vector<std::string>& keys, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                          std::vector<std::string>* values, std::vector<uint64_t>* sizes = nullptr) = 0;
  // Which keys exist, in order. Pipelined.
  virtual Status Exists(const std::vector<std::string>& keys, std::vector<bool>* out) = 0;
  // Sets key to value with a time to live (seconds; 0: none). only_if_absent: kept as it is when
  // the key exists (*written false then; optional).
  virtual Status Put(const std::string& key, const std::string& value, uint32_t ttl_s, bool only_if_absent,
                     bool* written = nullptr) = 0;
  // Sets the time to live of every key that exists (pipelined; a missing key is no error).
  virtual Status Touch(const std::vector<std::string>& keys, uint32_t ttl_s) = 0;
  // Removes keys (pipelined; a missing key is no error).
  virtual Status Remove(const std::vector<std::string>& keys) = 0;
  virtual Status Ping() = 0;
  // Keys matching a glob pattern and the bytes of their values (tests and reports; SCAN, never
  // KEYS, on a real server). Not for the hot path.
  virtual Status Census(const std::string& pattern, uint64_t* keys, uint64_t* bytes) = 0;
  virtual std::string Describe() const = 0;  // "redis://host:port" or "rediss://..." (never the password)
};

// A remote store's address: redis://[user[:password]@]host:port[/db], or rediss://... for TLS
// (store/tls_stream.h). kInvalidArgument for anything that is not such a URL (the password is
// never shown in the message).
struct RemoteUrl {
  bool tls = false;  // rediss://
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user, password;  // empty: none (a password alone: the "default" user)
};
Status ParseRemoteUrl(const std::string& url, RemoteUrl* out);

struct RedisOptions {
  RemoteUrl url;
  uint32_t timeout_ms = 2000;  // connect (and TLS handshake) and every reply
  int max_connections = 4;     // the pool's connections at most (idle ones are reused)
  Env* env = nullptr;          // the sockets' Env (outlives the store); nullptr: Env::Default()
  // TLS (url.tls): the CAs to trust (PEM; empty: the system's store) and an optional client
  // certificate and key (PEM, both or neither) for a server with tls-auth-clients. Read at open.
  std::string ca_file, cert_file, key_file;
};

// A Redis client: the connections are the Env's TCP sockets (env/env.h ConnectTcp), under TLS 1.2+
// for rediss:// (store/tls_stream.h: the certificate verified against ca_file or the system's CAs,
// its name checked against the URL's host); hiredis (Debian's libhiredis 0.14, which has no TLS)
// only formats the commands (redisFormatCommandArgv) and parses the replies (its redisReader).
// Open reads the TLS files at once (an unreadable or bad file: kInvalidArgument naming it;
// kUnsupported for rediss:// in a build without OpenSSL, or any URL in a build without hiredis)
// and, with check_now, checks the server (PING, after AUTH and SELECT): kIOError naming the
// address when it cannot be reached, its certificate fails verification or names another host,
// TLS meets a plain port or a plain connection meets a TLS port (each message says which; every
// wait bounded by timeout_ms: never a hang). A connection that fails mid-call is dropped and a
// new one made by the next call: the server may restart in between. Redis Cluster: the URL may
// name any node; the first MOVED reply loads the slot map (CLUSTER SLOTS) and every command is then
// routed to its key's slot master (one pipeline per node); MOVED reloads the map and resends, ASK
// resends with ASKING (at most 5 rounds: then kIOError). Connections are pooled per node (under
// TLS, each node's certificate must name the address the slot map gives for it).
// Replies are read by ReadRespReply (store/resp_reply.h): values go from the socket (or from TLS's
// decrypted stream) straight into their strings; a reply cut short or malformed is kIOError and
// its connection is dropped.
Status OpenRedisKv(const RedisOptions& opts, std::unique_ptr<RemoteKv>* out, bool check_now = true);

// An in-memory store for tests, with faults: down (every call kIOError), and direct access to the
// values (to damage one, or evict one as Redis's maxmemory would). Thread-safe.
class FakeRemoteKv : public RemoteKv {
 public:
  Status Get(const std::vector<std::string>& keys, std::vector<std::optional<std::string>>* values) override;
  Status GetRange(const std::vector<std::string>& keys, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                  std::vector<std::string>* values, std::vector<uint64_t>* sizes = nullptr) override;
  Status Exists(const std::vector<std::string>& keys, std::vector<bool>* out) override;
  Status Put(const std::string& key, const std::string& value, uint32_t ttl_s, bool only_if_absent,
             bool* written = nullptr) override;
  Status Touch(const std::vector<std::string>& keys, uint32_t ttl_s) override;
  Status Remove(const std::vector<std::string>& keys) override;
  Status Ping() override;
  Status Census(const std::string& pattern, uint64_t* keys, uint64_t* bytes) override;
  std::string Describe() const override { return "fake://"; }
  void SetDown(bool down);
  // Tests of streamed reads: GetRange calls after the first `after` wait until Release (or
  // SetDown: they then fail). after < 0: no hold.
  void HoldRangesAfter(int after);
  void Release();
  int range_calls();
  std::map<std::string, std::string> Snapshot();
  void Set(const std::string& key, const std::string& value);
  void Erase(const std::string& key);
  uint64_t calls();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool down_ = false;
  int hold_after_ = -1, range_calls_ = 0;
  uint64_t calls_ = 0;
  std::map<std::string, std::string> kv_;
};

// Redis's glob match (only '*' and '?' are special here): FakeRemoteKv::Census.
bool GlobMatch(const std::string& pattern, const std::string& s);

}  // namespace mz
