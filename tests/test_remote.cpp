// The pool's remote tier (src/pool/remote_tier.h) on a real Redis: a redis-server started by the
// test on a free loopback port with a temporary folder (the tests skip, saying why, when
// redis-server is not installed). Two pools on two folders stand for two servers of a fleet: one
// continues the other's conversation exactly, a shared prefix is stored once, a new conversation
// finds its prefix by chain hash, damaged or evicted values are computed again (never used), and
// Redis down then back: the pool goes on locally and its write-behind catches up.
// The envelope and URL checks run without Redis (FakeRemoteKv). RemoteTls: the same over rediss://
// (a redis-server with a TLS port and a certificate the test makes with `openssl req`), and each
// TLS failure (untrusted certificate, another host's, TLS to a plain port and plain to a TLS one)
// named at open.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "mzcache.h"
#include "policy/profiler.h"
#include "pool/chunk_hash.h"
#include "pool/pool.h"
#include "store/remote_kv.h"
#include "store/resp_reply.h"
#include "store/tls_stream.h"
#include "env/fault_env.h"
#include "pool/remote_tier.h"
#include "runtime/context.h"
#include "runtime/session_file.h"
#include "test_util.h"

namespace mz {
namespace {

constexpr int T = 64;  // chunk tokens in these tests (tiny model)

std::string ModelFile() { return test::ModelPath("tiny-qwen3", "q8_0"); }

std::unique_ptr<Model> LoadModel() {
  std::unique_ptr<Model> m;
  Status st = Model::Load(Env::Default(), ModelFile(), ModelOptions(), &m);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return m;
}

std::string FreshDir(const std::string& name) {
  const std::string d = test::TempDir() + "/remote-" + name + "-" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  return d;
}

std::string RedisServerPath() {
  for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(s);
    return 0;
  }
  close(s);
  return ntohs(a.sin_port);
}

// Self-signed certificates for the TLS tests, made by `openssl req` (P-256 keys: quick) in dir:
// cert/key name 127.0.0.1 (an IP SAN, not "localhost"); other/other_key a second one, trusted by no
// one. cert also serves as the client certificate (it is its own CA: redis trusts it).
struct TestCerts {
  std::string cert, key, other, other_key;
  bool Make(const std::string& dir) {
    std::filesystem::create_directories(dir);
    cert = dir + "/cert.pem", key = dir + "/key.pem", other = dir + "/other.pem", other_key = dir + "/other-key.pem";
    auto req = [&](const std::string& c, const std::string& k, const std::string& san) {
      const std::string cmd = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 "
                              "-subj /CN=mz-test -addext subjectAltName=" + san + " -keyout " + k + " -out " + c +
                              " >/dev/null 2>&1";
      return std::system(cmd.c_str()) == 0;
    };
    return req(cert, key, "IP:127.0.0.1") && req(other, other_key, "IP:127.0.0.1");
  }
};

// A redis-server of this test: loopback, a free port, no persistence, its own folder.
class RedisServer {
 public:
  ~RedisServer() { Stop(); }
  // TLS: with certs, the port is a TLS one (the plain port off unless plain_port > 0);
  // auth_clients is redis's tls-auth-clients ("yes": a client certificate is required).
  // tls_port: 0 for any free one; extra: more redis-server arguments (a cluster node's).
  bool StartTls(const TestCerts& certs, const std::string& auth_clients = "optional", int plain_port = 0,
                int tls_port = 0, const std::vector<std::string>& extra = {}) {
    tls_ = true;
    certs_ = certs;
    client_cert_ = auth_clients == "yes";
    tls_port_ = tls_port > 0 ? tls_port : FreePort();
    std::vector<std::string> args = {"--port", std::to_string(plain_port), "--tls-port", std::to_string(tls_port_),
                                     "--tls-cert-file", certs.cert, "--tls-key-file", certs.key, "--tls-ca-cert-file",
                                     certs.cert, "--tls-auth-clients", auth_clients};
    args.insert(args.end(), extra.begin(), extra.end());
    return Start(plain_port, args);
  }
  bool Start(int port = 0, const std::vector<std::string>& extra = {}) {
    if (port == 0) port = FreePort();
    port_ = port;
    dir_ = FreshDir("redis-" + std::to_string(port));
    std::filesystem::create_directories(dir_);
    pid_ = fork();
    if (pid_ == 0) {
      const std::string ps = std::to_string(port), log = dir_ + "/redis.log";
      std::vector<std::string> args = {"redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--dir", dir_, "--logfile", log};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& x : args) argv.push_back(x.data());
      argv.push_back(nullptr);
      execv(RedisServerPath().c_str(), argv.data());
      _exit(127);
    }
    // Ready once it answers PING (a readiness wait, not a timed assertion).
    RedisOptions ro = Options();
    ro.timeout_ms = 500;
    for (int i = 0; i < 500; ++i) {
      std::unique_ptr<RemoteKv> kv;
      Status st = OpenRedisKv(ro, &kv);
      if (st.ok() || st.message().find("NOAUTH") != std::string::npos) return true;  // up (it wants a password)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }
  std::string Url() const {
    return tls_ ? "rediss://127.0.0.1:" + std::to_string(tls_port_) : "redis://127.0.0.1:" + std::to_string(port_);
  }
  int port() const { return port_; }          // the plain port (unused by a TLS-only server)
  int tls_port() const { return tls_port_; }  // StartTls
  // A client's options for Url() (TLS: trusting the certificate, presenting it when required).
  RedisOptions Options() const {
    RedisOptions ro;
    EXPECT_TRUE(ParseRemoteUrl(Url(), &ro.url).ok());
    if (tls_) {
      ro.ca_file = certs_.cert;
      if (client_cert_) ro.cert_file = certs_.cert, ro.key_file = certs_.key;
    }
    return ro;
  }
  std::unique_ptr<RemoteKv> Client() const {
    RedisOptions ro = Options();
    std::unique_ptr<RemoteKv> kv;
    EXPECT_TRUE(OpenRedisKv(ro, &kv).ok());
    return kv;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string dir_;
  bool tls_ = false, client_cert_ = false;
  int tls_port_ = 0;
  TestCerts certs_;
};

bool HaveHiredis() {
  std::unique_ptr<RemoteKv> kv;
  return OpenRedisKv(RedisOptions(), &kv, /*check_now=*/false).code() != Status::kUnsupported;
}

#define NEED_REDIS()                                                                                \
  if (RedisServerPath().empty()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)"; \
  if (!HaveHiredis()) GTEST_SKIP() << "this build has no hiredis (apt-get install libhiredis-dev)"

PoolOptions Opts(const std::string& dir, const std::string& url) {
  PoolOptions o;
  o.dir = dir;
  o.context.n_ctx = 1024;
  o.context.kv_chunk_tokens = T;
  o.context.kv_codec = "none";
  o.persist_codec = "none";  // lossless: a continuation elsewhere is exact
  o.write_behind_idle_ms = 60000;
  o.remote.url = url;
  o.remote.timeout_ms = 1000;
  o.remote.retry_ms = 60000;  // tests retry through FlushRemote
  return o;
}

std::vector<int32_t> Tokens(int sys, int n, int seed) {
  std::vector<int32_t> t = test::PromptTokens(ModelFile(), sys);
  std::mt19937 rng{uint32_t(seed)};
  while (int(t.size()) < n) t.push_back(int32_t(100 + rng() % 2000));
  return t;
}

std::vector<float> Row(const float* l, int nv) { return std::vector<float>(l, l + nv); }

// Logits after `first` then `next`, computed by a plain context (no pool, no remote).
std::vector<float> Reference(Model* m, const std::vector<int32_t>& first, const std::vector<int32_t>& next) {
  ContextOptions co;
  co.n_ctx = 1024;
  co.kv_chunk_tokens = T;
  co.kv_codec = "none";
  co.swap_path = test::TempDir() + "/remote-ref-" + std::to_string(getpid()) + ".swap";
  Context c(m, co);
  EXPECT_TRUE(c.Init().ok());
  EXPECT_TRUE(c.Decode(first.data(), int(first.size()), false).ok());
  EXPECT_TRUE(c.Decode(next.data(), int(next.size()), false).ok());
  return Row(c.logits(0), int(m->hparams().n_vocab));
}

// Conversation id of a pool on dir decodes toks and commits; the remote write is waited for.
void Serve(Model* m, const PoolOptions& o, const std::string& id, const std::vector<int32_t>& toks,
           std::unique_ptr<Pool>* keep = nullptr) {
  std::unique_ptr<Pool> pool;
  ASSERT_TRUE(Pool::Open(m, o, &pool).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(pool->OpenConversation(id, &c).ok());
  ASSERT_TRUE(c->Decode(toks.data(), int(toks.size()), false).ok());
  ASSERT_TRUE(c->Commit().ok());
  Status st = pool->FlushRemote();
  ASSERT_TRUE(st.ok()) << st.ToString();
  if (keep) *keep = std::move(pool);
}

TEST(RemoteUrl, ParsesAndRefusesWhatItCannotDo) {
  RemoteUrl u;
  ASSERT_TRUE(ParseRemoteUrl("redis://127.0.0.1:6390", &u).ok());
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 6390);
  ASSERT_TRUE(ParseRemoteUrl("redis://mz:s3cret@cache.local:7000/2", &u).ok());
  EXPECT_EQ(u.user, "mz");
  EXPECT_EQ(u.password, "s3cret");
  EXPECT_EQ(u.host, "cache.local");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.db, 2);
  ASSERT_TRUE(ParseRemoteUrl("redis://host", &u).ok());
  EXPECT_EQ(u.port, 6379);
  EXPECT_FALSE(u.tls);
  ASSERT_TRUE(ParseRemoteUrl("rediss://mz:pw@host:6380/1", &u).ok());
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.host, "host");
  EXPECT_EQ(u.port, 6380);
  EXPECT_EQ(u.db, 1);
  EXPECT_EQ(ParseRemoteUrl("redisss://host", &u).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseRemoteUrl("http://host", &u).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseRemoteUrl("redis://host:0", &u).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseRemoteUrl("redis://host:99999", &u).code(), Status::kInvalidArgument);
  EXPECT_EQ(ParseRemoteUrl("redis://:6379", &u).code(), Status::kInvalidArgument);
  Status bad = ParseRemoteUrl("redis://mz:s3cret@host:bad", &u);  // the password is never shown
  EXPECT_EQ(bad.code(), Status::kInvalidArgument);
  EXPECT_EQ(bad.message().find("s3cret"), std::string::npos) << bad.message();
}

TEST(RemoteTier, EnvelopeFindsEveryDamage) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  RemoteTierOptions ro;
  ro.store = std::make_shared<FakeRemoteKv>();
  std::unique_ptr<RemoteTier> t;
  ASSERT_TRUE(RemoteTier::Open(*m, T, "none", ro, [](uint64_t) { return std::string(); }, &t).ok());
  const std::string key = t->ChunkKey(42), payload(5000, 'x');
  const std::string v = t->Wrap(RemoteTier::kChunk, key, payload);
  std::string out;
  ASSERT_TRUE(t->Unwrap(RemoteTier::kChunk, key, v, &out).ok());
  EXPECT_EQ(out, payload);
  std::string flip = v;
  flip[flip.size() - 7] ^= 0x10;
  EXPECT_EQ(t->Unwrap(RemoteTier::kChunk, key, flip, &out).code(), Status::kCorruption);
  EXPECT_EQ(t->Unwrap(RemoteTier::kChunk, key, v.substr(0, v.size() - 1), &out).code(), Status::kCorruption);
  EXPECT_EQ(t->Unwrap(RemoteTier::kChunk, key, v.substr(0, 10), &out).code(), Status::kCorruption);
  EXPECT_EQ(t->Unwrap(RemoteTier::kChunk, t->ChunkKey(43), v, &out).code(), Status::kCorruption);  // another key's
  EXPECT_EQ(t->Unwrap(RemoteTier::kManifest, key, v, &out).code(), Status::kCorruption);           // another kind
  std::string other = v;
  other[16] ^= 1;  // the model fingerprint: another model's chunk under this key
  Status st = t->Unwrap(RemoteTier::kChunk, key, other, &out);
  EXPECT_EQ(st.code(), Status::kCorruption);
  EXPECT_NE(st.message().find("another model"), std::string::npos) << st.message();
}

TEST(RemoteTier, AnotherServerContinuesTheConversationExactly) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 20, 1), next = {11, 12, 13};
  Serve(m.get(), Opts(FreshDir("a1"), redis.Url()), "chat-1", toks);
  // Server B never saw it: it opens chat-1 from Redis and continues.
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("b1"), redis.Url()), &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("chat-1", &c).ok());
  std::vector<int32_t> hist;
  ASSERT_TRUE(b->History("chat-1", &hist).ok());
  EXPECT_EQ(hist, toks);
  ASSERT_TRUE(c->Decode(next.data(), int(next.size()), false).ok());
  EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), Reference(m.get(), toks, next));
  const PoolStats s = b->Stats();
  EXPECT_EQ(s.remote.manifest_hits, 1u);
  EXPECT_EQ(s.remote.chunks_fetched, 3u);  // its 3 full chunks; the tail came in the manifest
  EXPECT_EQ(s.recomputed, 0u);
  EXPECT_EQ(s.remote.damaged, 0u);
  // A conversation Redis does not hold is a new one.
  std::shared_ptr<Conversation> fresh;
  ASSERT_TRUE(b->OpenConversation("never-seen", &fresh).ok());
  EXPECT_EQ(fresh->n_tokens(), 0);
  EXPECT_EQ(b->Stats().remote.manifest_misses, 1u);
}

TEST(RemoteTier, SharedSystemPromptIsStoredOnceForTheFleet) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  // Two chunks of system prompt, then each its own chunk and tail.
  const std::vector<int32_t> a = Tokens(2 * T, 3 * T + 10, 1), b = Tokens(2 * T, 3 * T + 30, 2);
  ASSERT_TRUE(std::equal(a.begin(), a.begin() + 2 * T, b.begin()));
  std::unique_ptr<Pool> pb;
  Serve(m.get(), Opts(FreshDir("a2"), redis.Url()), "a", a);
  Serve(m.get(), Opts(FreshDir("b2"), redis.Url()), "b", b, &pb);
  std::unique_ptr<RemoteKv> kv = redis.Client();
  uint64_t keys = 0, bytes = 0;
  ASSERT_TRUE(kv->Census("mz:*:k:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 4u);  // 2 shared + 1 of each
  const PoolStats s = pb->Stats();
  EXPECT_EQ(s.remote.chunks_present, 2u);  // server b found the system prompt there
  EXPECT_EQ(s.remote.chunks_written, 1u);
  uint64_t mkeys = 0;
  ASSERT_TRUE(kv->Census("mz:*:m:*", &mkeys, &bytes).ok());
  EXPECT_EQ(mkeys, 2u);
}

TEST(RemoteTier, NewConversationFindsItsPrefixByChainHash) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> a = Tokens(2 * T, 2 * T + 40, 1);
  Serve(m.get(), Opts(FreshDir("a3"), redis.Url()), "a", a);
  // Server B, a request with no conversation id: the same 2 chunks, another continuation. Streamed
  // (the default) and fetched whole: both exact.
  std::vector<int32_t> q(a.begin(), a.begin() + 2 * T);
  for (int i = 0; i < 30; ++i) q.push_back(300 + i);
  const std::vector<int32_t> first(q.begin(), q.begin() + 2 * T), rest(q.begin() + 2 * T, q.end());
  const std::vector<float> want = Reference(m.get(), first, rest);
  for (const bool stream : {true, false}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    PoolOptions o = Opts(FreshDir(stream ? "b3s" : "b3w"), redis.Url());
    o.remote.stream_prefix = stream;
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), o, &b).ok());
    std::shared_ptr<Conversation> c;
    const std::string id = stream ? "q-s" : "q-w";  // not in Redis: a new conversation
    ASSERT_TRUE(b->OpenConversation(id, &c).ok());
    ASSERT_TRUE(c->Decode(q.data(), int(q.size()), false).ok());
    for (int i = 0; i < 2000 && b->Stats().remote.streaming > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const PoolStats s = b->Stats();
    EXPECT_EQ(s.prefix_chunks_reused, 2u);
    EXPECT_EQ(s.remote.prefix_chunks, 2u);
    EXPECT_EQ(s.remote.chunks_fetched, 2u);
    EXPECT_EQ(s.remote.damaged, 0u);
    EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), want);
  }
}

// The fetch-or-compute plan (policy/remote_fetch.h) applied by RemotePrefix: with the device
// profile's remote rate at the slowest plausible figure (1 B/s) and a measured prefill rate (a
// warm-up conversation on the same pool), the prefix is computed again, counted, and the answer is
// the same; with a rate no prefill can beat, it is fetched.
TEST(RemoteTier, PrefixOnASlowLinkIsComputedAgainAndCounted) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> a = Tokens(2 * T, 2 * T + 40, 1);
  Serve(m.get(), Opts(FreshDir("a9"), redis.Url()), "a", a);
  std::vector<int32_t> q(a.begin(), a.begin() + 2 * T);
  for (int i = 0; i < 30; ++i) q.push_back(300 + i);
  std::vector<int32_t> warm;
  std::mt19937 rng{99};
  for (int i = 0; i < 40; ++i) warm.push_back(int32_t(100 + rng() % 2000));
  for (const bool slow : {true, false}) {
    const std::string dir = FreshDir(slow ? "b9s" : "b9f");
    std::filesystem::create_directories(dir);
    DeviceProfile prof = DeviceProfile::Default();
    prof.remote_read_Bps = slow ? 1.0 : 1e300;
    PoolOptions o = Opts(dir, redis.Url());
    o.context.profile_path = dir + "-profile.json";
    ASSERT_TRUE(prof.Save(o.context.profile_path).ok());
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), o, &b).ok());
    std::shared_ptr<Conversation> w, c;
    // Ids of this round: the last round's pool may have written its own to Redis when it closed.
    const std::string round = slow ? "-slow" : "-fast";
    ASSERT_TRUE(b->OpenConversation("w" + round, &w).ok());
    ASSERT_TRUE(w->Decode(warm.data(), int(warm.size()), false).ok());  // measures the prefill rate
    ASSERT_TRUE(b->OpenConversation("q" + round, &c).ok());
    ASSERT_TRUE(c->Decode(q.data(), int(q.size()), false).ok());
    const PoolStats s = b->Stats();
    EXPECT_EQ(s.remote.fetches_skipped_slower, slow ? 1u : 0u) << slow;
    EXPECT_EQ(s.remote.chunks_skipped_slower, slow ? 2u : 0u) << slow;
    EXPECT_EQ(s.remote.prefix_chunks, slow ? 0u : 2u) << slow;
    EXPECT_EQ(s.prefix_chunks_reused, slow ? 0u : 2u) << slow;
    const std::vector<int32_t> first(q.begin(), q.begin() + 2 * T), rest(q.begin() + 2 * T, q.end());
    EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), Reference(m.get(), first, rest)) << slow;
    std::filesystem::remove(o.context.profile_path);
  }
}

// `mzcache profile --remote`'s measurement (ProfileRemote): a rate and a first byte come out, the
// values are read back as written and removed after; an unreachable store is an error.
TEST(RemoteTier, ProfileMeasuresTheRateAndRemovesItsValues) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto kv = redis.Client();
  ASSERT_TRUE(kv);
  DeviceProfile p;
  std::string note;
  Status st = ProfileRemote(Env::Default(), kv.get(), 64 << 10, 3, 2, &p, [&](const std::string& t) { note += t; });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(p.remote_read_Bps, 1.0);
  EXPECT_GT(p.remote_first_byte_s, 0.0);
  EXPECT_NE(note.find("Remote tier"), std::string::npos) << note;
  uint64_t keys = 1, bytes = 1;
  ASSERT_TRUE(kv->Census("mz:profile:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 0u);
  redis.Stop();
  DeviceProfile q;
  EXPECT_FALSE(ProfileRemote(Env::Default(), kv.get(), 1024, 1, 1, &q, nullptr).ok());
  EXPECT_EQ(q.remote_read_Bps, 0.0);
}

TEST(RemoteTier, DamagedOrEvictedValuesAreComputedAgainNeverUsed) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 4 * T + 5, 3), next = {21, 22};
  std::unique_ptr<Pool> a;
  Serve(m.get(), Opts(FreshDir("a4"), redis.Url()), "d", toks, &a);
  std::unique_ptr<RemoteKv> kv = redis.Client();
  RemoteTierOptions ro;
  ro.store = std::make_shared<FakeRemoteKv>();  // only for the key names
  std::unique_ptr<RemoteTier> names;
  ASSERT_TRUE(RemoteTier::Open(*m, T, "none", ro, [](uint64_t) { return std::string(); }, &names).ok());
  const std::vector<uint64_t> h = ChainHashes(m->identity().header_hash, toks.data(), 4 * T, T);
  std::vector<std::string> keys;
  for (uint64_t x : h) keys.push_back(names->ChunkKey(x));
  std::vector<std::optional<std::string>> v;
  ASSERT_TRUE(kv->Get(keys, &v).ok());
  for (auto& x : v) ASSERT_TRUE(x.has_value());
  std::vector<std::optional<std::string>> manifest;  // each case's pool writes "d" back (longer): restored
  ASSERT_TRUE(kv->Get({names->ManifestKey("d")}, &manifest).ok());
  ASSERT_TRUE(manifest[0].has_value());
  std::string flip = *v[0], cut = v[1]->substr(0, v[1]->size() / 2), other = *v[2];
  flip[flip.size() / 2] ^= 0x04;  // a bit flip inside the payload
  other[16] ^= 0x01;              // another model's chunk under this key
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"bit flip", flip}, {"truncation", cut}, {"another model", other}, {"evicted", ""}};
  const std::vector<float> want = Reference(m.get(), toks, next);
  for (size_t i = 0; i < damages.size(); ++i) {
    SCOPED_TRACE(damages[i].first);
    std::unique_ptr<RemoteKv> fix = redis.Client();
    // Each case damages one chunk of a fresh copy: the others as written.
    for (size_t j = 0; j < keys.size(); ++j) ASSERT_TRUE(fix->Put(keys[j], *v[j], 0, false).ok());
    ASSERT_TRUE(fix->Put(names->ManifestKey("d"), *manifest[0], 0, false).ok());
    const size_t k = std::min<size_t>(i, keys.size() - 1);
    if (damages[i].second.empty()) ASSERT_TRUE(fix->Remove({keys[k]}).ok());
    else ASSERT_TRUE(fix->Put(keys[k], damages[i].second, 0, false).ok());
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("b4-" + std::to_string(i)), redis.Url()), &b).ok());
    std::shared_ptr<Conversation> c;
    ASSERT_TRUE(b->OpenConversation("d", &c).ok());
    std::vector<int32_t> hist;
    ASSERT_TRUE(b->History("d", &hist).ok());
    EXPECT_EQ(hist, toks);
    ASSERT_TRUE(c->Decode(next.data(), int(next.size()), false).ok());
    EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), want);
    const PoolStats s = b->Stats();
    EXPECT_GE(s.remote.damaged, 1u);
    EXPECT_EQ(s.recomputed, 1u);  // the conversation's tokens computed again
  }
  // A damaged manifest: a miss (a new conversation), never a wrong one.
  std::unique_ptr<RemoteKv> fix = redis.Client();
  std::string bad = *manifest[0];
  bad[bad.size() - 100] ^= 0x20;
  ASSERT_TRUE(fix->Put(names->ManifestKey("d"), bad, 0, false).ok());
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("b4-m"), redis.Url()), &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("d", &c).ok());
  EXPECT_EQ(c->n_tokens(), 0);
  EXPECT_EQ(b->Stats().remote.damaged, 1u);
}

TEST(RemoteTier, RedisDownThePoolGoesOnLocallyAndCatchesUpWhenBack) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  const int port = redis.port();
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 2 * T + 9, 4);
  std::unique_ptr<Pool> a;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("a5"), redis.Url()), &a).ok());
  EXPECT_FALSE(a->Stats().remote.degraded);
  redis.Stop();
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(a->OpenConversation("down", &c).ok());  // the lookup fails: a new conversation
  ASSERT_TRUE(c->Decode(toks.data(), int(toks.size()), false).ok());
  ASSERT_TRUE(c->Commit().ok());
  Status st = a->FlushRemote();
  EXPECT_EQ(st.code(), Status::kIOError) << st.ToString();
  PoolStats s = a->Stats();
  EXPECT_TRUE(s.remote.degraded);
  EXPECT_EQ(s.remote.pending, 1);
  EXPECT_EQ(s.persists, 1u);  // the local tier is not held back
  EXPECT_FALSE(s.remote.last_error.empty());
  // Back (same port, empty): the write-behind catches up.
  ASSERT_TRUE(redis.Start(port));
  st = a->FlushRemote();
  ASSERT_TRUE(st.ok()) << st.ToString();
  s = a->Stats();
  EXPECT_FALSE(s.remote.degraded);
  EXPECT_EQ(s.remote.pending, 0);
  EXPECT_EQ(s.remote.manifests_written, 1u);
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("b5"), redis.Url()), &b).ok());
  std::shared_ptr<Conversation> cb;
  ASSERT_TRUE(b->OpenConversation("down", &cb).ok());
  EXPECT_EQ(cb->n_tokens(), int(toks.size()));
}

TEST(RemoteTier, DeletedConversationIsNotBroughtBack) {
  NEED_REDIS();
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, T + 9, 5);
  std::unique_ptr<Pool> a;
  Serve(m.get(), Opts(FreshDir("a6"), redis.Url()), "gone", toks, &a);
  ASSERT_TRUE(a->Delete("gone").ok());
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), Opts(FreshDir("b6"), redis.Url()), &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("gone", &c).ok());
  EXPECT_EQ(c->n_tokens(), 0);
}

TEST(RemoteTier, AclUserWithThePasswordFromAFile) {
  NEED_REDIS();
  RedisServer redis;
  // The default user off: only ACL user mz with its password gets in.
  ASSERT_TRUE(redis.Start(0, {"--user", "default", "off", "--user", "mz", "on", ">s3cret-pw", "~*", "&*", "+@all"}));
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::string dir = FreshDir("acl");
  std::filesystem::create_directories(dir);
  const std::string pw = dir + "/pw";
  ASSERT_TRUE(Env::Default()->WriteSmallFile(pw, "s3cret-pw\n", true).ok());
  const std::string url = "redis://mz@127.0.0.1:" + std::to_string(redis.port());
  PoolOptions o = Opts(dir + "/pool", url);
  o.remote.password_file = pw;
  const std::vector<int32_t> toks = Tokens(0, T + 3, 6);
  Serve(m.get(), o, "acl", toks);
  // A wrong password: degraded, never an error of the pool.
  ASSERT_TRUE(Env::Default()->WriteSmallFile(pw, "wrong\n", true).ok());
  o.dir = dir + "/pool2";
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Open(m.get(), o, &p).ok());
  const PoolStats s = p->Stats();
  EXPECT_TRUE(s.remote.degraded);
  EXPECT_NE(s.remote.last_error.find("AUTH"), std::string::npos) << s.remote.last_error;
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(p->OpenConversation("acl", &c).ok());
  EXPECT_EQ(c->n_tokens(), 0);  // not fetched: a new conversation
}

TEST(RemoteTier, UnreadablePasswordOrCaFileFailTheOpen) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  PoolOptions o = Opts(FreshDir("pw"), "redis://mz@127.0.0.1:1");
  o.remote.password_file = FreshDir("no-such-password-file");
  std::unique_ptr<Pool> p;
  Status st = Pool::Open(m.get(), o, &p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("password file"), std::string::npos) << st.ToString();
  o.remote.password_file.clear();
  // Down at start is not an error: a degraded tier; a TLS file that cannot be read is.
  if (!HaveHiredis()) GTEST_SKIP() << "this build has no hiredis (apt-get install libhiredis-dev)";
  o.remote.url = "rediss://127.0.0.1:6380";
  o.remote.ca_file = FreshDir("no-such-ca-file");
  st = Pool::Open(m.get(), o, &p);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("CA file"), std::string::npos) << st.ToString();
  o.remote.url = "redis://127.0.0.1:1";  // a CA file is for rediss:// only
  st = Pool::Open(m.get(), o, &p);
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  o.remote.ca_file.clear();
  o.remote.url = "redis://127.0.0.1:1";
  ASSERT_TRUE(Pool::Open(m.get(), o, &p).ok());
  EXPECT_TRUE(p->Stats().remote.degraded);
}

bool HaveTls() {
  std::unique_ptr<TlsClient> c;
  return TlsClient::Create(Env::Default(), TlsOptions(), &c).code() != Status::kUnsupported;
}

#define NEED_TLS()                                                                                   \
  NEED_REDIS();                                                                                      \
  if (!HaveTls()) GTEST_SKIP() << "this build has no OpenSSL (apt-get install libssl-dev)";        \
  TestCerts certs;                                                                                   \
  if (!certs.Make(FreshDir("certs"))) GTEST_SKIP() << "openssl req failed (apt-get install openssl)"

// The status of opening a client on url (PING at once) with these TLS files.
Status OpenWith(const std::string& url, const std::string& ca, const std::string& cert = "",
                const std::string& key = "", Env* env = nullptr) {
  RedisOptions ro;
  MZ_RETURN_IF_ERROR(ParseRemoteUrl(url, &ro.url));
  ro.timeout_ms = 1500;
  ro.ca_file = ca;
  ro.cert_file = cert;
  ro.key_file = key;
  ro.env = env;
  std::unique_ptr<RemoteKv> kv;
  return OpenRedisKv(ro, &kv);
}

bool Has(const Status& st, const std::string& what) { return st.message().find(what) != std::string::npos; }

TEST(RemoteTls, AnotherServerContinuesTheConversationOverTls) {
  NEED_TLS();
  RedisServer redis;
  ASSERT_TRUE(redis.StartTls(certs));  // a TLS port only
  auto m = LoadModel();
  ASSERT_TRUE(m);
  PoolOptions oa = Opts(FreshDir("tls-a"), redis.Url()), ob = Opts(FreshDir("tls-b"), redis.Url());
  oa.remote.ca_file = ob.remote.ca_file = certs.cert;
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 20, 31), next = {11, 12, 13};
  Serve(m.get(), oa, "tls-chat", toks);  // written behind, over TLS
  uint64_t keys = 0, bytes = 0;
  ASSERT_TRUE(redis.Client()->Census("mz:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 4u);  // its manifest and 3 chunks
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), ob, &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("tls-chat", &c).ok());  // restored over TLS
  ASSERT_TRUE(c->Decode(next.data(), int(next.size()), false).ok());
  EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), Reference(m.get(), toks, next));
  const PoolStats s = b->Stats();
  EXPECT_EQ(s.remote.address.rfind("rediss://", 0), 0u) << s.remote.address;
  EXPECT_FALSE(s.remote.degraded) << s.remote.last_error;
  EXPECT_EQ(s.remote.chunks_fetched, 3u);
  EXPECT_EQ(s.recomputed, 0u);
}

TEST(RemoteTls, EachMismatchIsANamedErrorAtOpen) {
  NEED_TLS();
  RedisServer redis;
  const int plain = FreePort();
  ASSERT_TRUE(redis.StartTls(certs, "optional", plain));  // a TLS port and a plain one
  const std::string tls_url = "rediss://127.0.0.1:" + std::to_string(redis.tls_port());
  Status st = OpenWith(tls_url, certs.cert);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = OpenWith(tls_url, certs.other);  // a certificate no CA we trust signed
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_TRUE(Has(st, "certificate verify failed")) << st.ToString();
  st = OpenWith(tls_url, "");  // the system's CAs do not know it either (or there are none here)
  EXPECT_TRUE(Has(st, "certificate verify failed") || Has(st, "system's certificate authorities")) << st.ToString();
  st = OpenWith("rediss://localhost:" + std::to_string(redis.tls_port()), certs.cert);  // it names 127.0.0.1
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_TRUE(Has(st, "does not name localhost")) << st.ToString();
  st = OpenWith("rediss://127.0.0.1:" + std::to_string(plain), certs.cert);  // TLS to the plain port
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_TRUE(Has(st, "TLS handshake") && Has(st, "plain")) << st.ToString();
  st = OpenWith("redis://127.0.0.1:" + std::to_string(redis.tls_port()), "");  // plain to the TLS port
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_TRUE(Has(st, "rediss://")) << st.ToString();
  // In a pool: degraded from the start, the reason in its report; never a wrong value.
  auto m = LoadModel();
  ASSERT_TRUE(m);
  PoolOptions o = Opts(FreshDir("tls-bad"), tls_url);
  o.remote.ca_file = certs.other;
  std::unique_ptr<Pool> p;
  ASSERT_TRUE(Pool::Open(m.get(), o, &p).ok());
  EXPECT_TRUE(p->Stats().remote.degraded);
  EXPECT_NE(p->Stats().remote.last_error.find("certificate verify failed"), std::string::npos)
      << p->Stats().remote.last_error;
}

TEST(RemoteTls, ClientCertificateForTlsAuthClientsAndBadFiles) {
  NEED_TLS();
  RedisServer redis;
  ASSERT_TRUE(redis.StartTls(certs, "yes"));  // a client certificate is required
  Status st = OpenWith(redis.Url(), certs.cert);
  EXPECT_FALSE(st.ok()) << "a server that requires a client certificate let us in without one";
  st = OpenWith(redis.Url(), certs.cert, certs.cert, certs.key);
  EXPECT_TRUE(st.ok()) << st.ToString();
  st = OpenWith(redis.Url(), certs.cert, certs.other, certs.other_key);  // one the server does not trust
  EXPECT_FALSE(st.ok());
  // Bad files: named at open, before any connection.
  st = OpenWith(redis.Url(), certs.cert, certs.cert, "");
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  st = OpenWith(redis.Url(), certs.cert, certs.cert, certs.other_key);
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(Has(st, "does not match")) << st.ToString();
  st = OpenWith(redis.Url(), certs.key);  // a key where the CAs should be
  EXPECT_EQ(st.code(), Status::kInvalidArgument) << st.ToString();
  EXPECT_TRUE(Has(st, "no PEM certificate")) << st.ToString();
  st = OpenWith(redis.Url(), certs.cert + ".missing");
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(Has(st, ".missing")) << st.ToString();
}

// Faults of the Env's sockets reach TLS connections: a refused connect and a read that fails mid
// reply are errors, never values; the next call makes a new connection and reads exactly.
// `mzcache profile --remote rediss://... --remote-ca-file F` (mz_profile_params.remote_ca_file,
// 0.19): a Redis whose certificate a private CA signed is measured when that CA is given, and
// refused (certificate verify failed, nothing written) when it is not; a CA file with a redis://
// URL, or without a URL, and an unreadable one are refused naming it.
TEST(RemoteTls, ProfileTrustsAPrivateCaFile) {
  NEED_TLS();
  RedisServer redis;
  ASSERT_TRUE(redis.StartTls(certs));
  const std::string dir = FreshDir("tls-prof");
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/profile.json";
  mz_profile_params pp = mz_profile_default_params();
  pp.dir = dir.c_str();
  pp.file_mib = 8;
  pp.quick = true;
  const std::string url = redis.Url();
  pp.remote_url = url.c_str();
  pp.remote_ca_file = certs.cert.c_str();
  ASSERT_EQ(mz_profile_device(ModelFile().c_str(), &pp, out.c_str()), MZ_OK) << mz_last_error();
  DeviceProfile prof;
  ASSERT_TRUE(DeviceProfile::Load(out, &prof).ok());
  EXPECT_GT(prof.remote_read_Bps, 0);
  std::filesystem::remove(out);
  pp.remote_ca_file = nullptr;  // the system's CAs: they do not know the private CA
  EXPECT_NE(mz_profile_device(ModelFile().c_str(), &pp, out.c_str()), MZ_OK);
  EXPECT_TRUE(std::string(mz_last_error()).find("certificate verify failed") != std::string::npos ||
              std::string(mz_last_error()).find("system's certificate authorities") != std::string::npos)
      << mz_last_error();
  EXPECT_FALSE(std::filesystem::exists(out));
  pp.remote_ca_file = "/nonexistent/mz-private-ca.pem";
  EXPECT_NE(mz_profile_device(ModelFile().c_str(), &pp, out.c_str()), MZ_OK);
  EXPECT_NE(std::string(mz_last_error()).find("mz-private-ca.pem"), std::string::npos) << mz_last_error();
  const std::string plain = "redis://127.0.0.1:" + std::to_string(redis.tls_port());
  pp.remote_url = plain.c_str();
  pp.remote_ca_file = certs.cert.c_str();
  EXPECT_EQ(mz_profile_device(ModelFile().c_str(), &pp, out.c_str()), MZ_ERR_INVALID_ARG) << mz_last_error();
  pp.remote_url = nullptr;
  EXPECT_EQ(mz_profile_device(ModelFile().c_str(), &pp, out.c_str()), MZ_ERR_INVALID_ARG) << mz_last_error();
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(RemoteTls, SocketFaultsUnderTlsAreErrorsNeverValues) {
  NEED_TLS();
  RedisServer redis;
  ASSERT_TRUE(redis.StartTls(certs));
  FaultEnv env(Env::Default());
  env.fail_connects_after = 0;
  Status st = OpenWith(redis.Url(), certs.cert, "", "", &env);
  EXPECT_TRUE(Has(st, "injected")) << st.ToString();
  RedisOptions ro = redis.Options();
  ro.env = &env;
  std::unique_ptr<RemoteKv> kv;
  ASSERT_TRUE(OpenRedisKv(ro, &kv).ok());
  std::string value(3 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = char(i * 2654435761u >> 13);
  ASSERT_TRUE(kv->Put("mz:tls:v", value, 60, false).ok());
  const int reads = env.n_socket_reads.load();
  env.fail_socket_reads_after = 3;  // inside the 3 MiB reply
  std::vector<std::optional<std::string>> got;
  st = kv->Get({"mz:tls:v"}, &got);
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_TRUE(Has(st, "injected")) << st.ToString();
  EXPECT_GT(env.n_socket_reads.load(), reads + 3);
  const int connects = env.n_connects.load();
  ASSERT_TRUE(kv->Get({"mz:tls:v"}, &got).ok());
  EXPECT_EQ(env.n_connects.load(), connects + 1);  // the broken connection was dropped
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0]);
  EXPECT_TRUE(*got[0] == value);
}

// Through the fault-injecting fake (no Redis): conversations generated on four threads at once while
// the store goes down and up under the write-behind (TSan: label concurrency). Once it stays up,
// every conversation is in the store and another pool reads each back exactly.
TEST(RemoteTierConcurrency, WritesWhileTheStoreFlapsAllArriveAndReadBackExactly) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  auto fake = std::make_shared<FakeRemoteKv>();
  auto opts = [&](const std::string& dir) {
    PoolOptions o = Opts(dir, "");
    o.remote.store = fake;
    o.remote.retry_ms = 1;
    return o;
  };
  std::unique_ptr<Pool> a;
  ASSERT_TRUE(Pool::Open(m.get(), opts(FreshDir("flap-a")), &a).ok());
  constexpr int kConvs = 4;
  std::vector<std::vector<int32_t>> toks;
  for (int i = 0; i < kConvs; ++i) toks.push_back(Tokens(T, 2 * T + 7 * i + 1, 10 + i));
  std::atomic<bool> done{false};
  std::thread flapper([&] {
    for (int k = 0; !done.load(); ++k) {
      fake->SetDown(k % 2 == 0);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> th;
  std::vector<Status> result(kConvs);
  for (int i = 0; i < kConvs; ++i)
    th.emplace_back([&, i] {
      std::shared_ptr<Conversation> c;
      Status st = a->OpenConversation("f" + std::to_string(i), &c);
      if (st.ok()) st = c->Decode(toks[size_t(i)].data(), int(toks[size_t(i)].size()), false);
      if (st.ok()) st = c->Commit();
      result[size_t(i)] = st;
    });
  for (auto& t : th) t.join();
  done = true;
  flapper.join();
  for (const Status& st : result) ASSERT_TRUE(st.ok()) << st.ToString();
  fake->SetDown(false);
  Status st = a->FlushRemote();
  if (!st.ok()) st = a->FlushRemote();  // a pass that began while it was down
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(a->Stats().remote.pending, 0);
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), opts(FreshDir("flap-b")), &b).ok());
  const int32_t next = 77;
  const int nv = int(m->hparams().n_vocab);
  for (int i = 0; i < kConvs; ++i) {
    SCOPED_TRACE(i);
    const std::string id = "f" + std::to_string(i);
    std::shared_ptr<Conversation> ca, cb;
    ASSERT_TRUE(b->OpenConversation(id, &cb).ok());
    ASSERT_EQ(cb->n_tokens(), int(toks[size_t(i)].size()));
    ASSERT_TRUE(a->OpenConversation(id, &ca).ok());
    ASSERT_TRUE(ca->Decode(&next, 1, false).ok());
    ASSERT_TRUE(cb->Decode(&next, 1, false).ok());
    EXPECT_EQ(Row(cb->logits(0), nv), Row(ca->logits(0), nv));
  }
  // Three new conversations at once on a third pool, each starting with the shared chunk: each
  // reuses it (from the store, or from another of them once it holds it), none computes it.
  std::unique_ptr<Pool> c3;
  ASSERT_TRUE(Pool::Open(m.get(), opts(FreshDir("flap-c")), &c3).ok());
  std::vector<std::thread> nt;
  std::vector<Status> nres(3);
  for (int i = 0; i < 3; ++i)
    nt.emplace_back([&, i] {
      std::vector<int32_t> q(toks[0].begin(), toks[0].begin() + T);
      for (int k = 0; k < 10; ++k) q.push_back(500 + 10 * i + k);
      std::shared_ptr<Conversation> c;
      Status st = c3->OpenConversation("n" + std::to_string(i), &c);
      if (st.ok()) st = c->Decode(q.data(), int(q.size()), false);
      nres[size_t(i)] = st;
    });
  for (auto& t : nt) t.join();
  for (const Status& st : nres) ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(c3->Stats().prefix_chunks_reused, 3u);
  // The shared first chunk is stored once.
  uint64_t keys = 0, bytes = 0;
  ASSERT_TRUE(fake->Census("mz:*:k:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 1u + kConvs);  // the shared chunk + each one's own second chunk
}


// ---- streamed restore (FakeRemoteKv: no Redis needed; its GetRange can be held mid-stream) ----

PoolOptions FakeOpts(const std::string& dir, const std::shared_ptr<FakeRemoteKv>& kv) {
  PoolOptions o = Opts(dir, "");
  o.remote.store = kv;
  return o;
}

// The next token's logits after conversation id's stored history, restored front layers first by
// restore_generate in a pool on dir (its local storage, or the store when dir does not hold it).
std::vector<float> RestoreNext(Model* m, const PoolOptions& o, const std::string& id, int32_t next,
                               PoolStats* stats = nullptr) {
  std::unique_ptr<Pool> pool;
  EXPECT_TRUE(Pool::Open(m, o, &pool).ok());
  std::shared_ptr<Conversation> c;
  EXPECT_TRUE(pool->OpenConversation(id, &c).ok());
  PipelineOptions po;
  RestoreGenerateStats rs;
  Status st = c->RestoreGenerate(&next, 1, po, &rs);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (stats) *stats = pool->Stats();
  return st.ok() ? Row(c->logits(0), int(m->hparams().n_vocab)) : std::vector<float>();
}

// A server that does not hold a conversation opens it before its chunks arrive: only their heads
// (session header and index) are fetched at open, and restore_generate restores the first layers
// while the rest is still in the store (held here after layer 0). Released, the result equals the
// restore from local storage of the server that wrote it, bit for bit.
TEST(RemoteStream, FirstLayersAreRestoredBeforeTheRestArrivesAndTheResultIsExact) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  auto kv = std::make_shared<FakeRemoteKv>();
  const std::string dir_a = FreshDir("sa");
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 20, 7);
  const int32_t next = 77;
  Serve(m.get(), FakeOpts(dir_a, kv), "s", toks);
  const std::vector<float> want = Reference(m.get(), toks, {next});

  kv->HoldRangesAfter(2);  // range call 0: the heads; 1: layer 0 of every chunk; 2 (layer 1) waits
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(FreshDir("sb"), kv), &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("s", &c).ok());  // returns with the chunks still arriving
  EXPECT_EQ(b->Stats().remote.streaming, 3);
  EXPECT_EQ(b->Stats().remote.chunks_fetched, 0u);
  std::vector<float> remote;
  Status st;
  std::thread gen([&] {
    PipelineOptions po;
    RestoreGenerateStats rs;
    st = c->RestoreGenerate(&next, 1, po, &rs);
    if (st.ok()) remote = Row(c->logits(0), int(m->hparams().n_vocab));
  });
  // Readiness wait (not a timing): the restore has a layer-0 unit resident while layer 1 is held.
  bool used_early = false;
  for (int i = 0; i < 2000 && !used_early; ++i) {
    const PoolStats s = b->Stats();
    used_early = s.shared.units_resident >= 1 && kv->range_calls() == 3 && s.remote.chunks_fetched == 0;
    if (!used_early) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(used_early) << "no shared unit was restored while layer 1 was still held in the store";
  kv->Release();
  gen.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(remote, want);
  const PoolStats s = b->Stats();
  EXPECT_EQ(s.remote.chunks_fetched, 3u);
  EXPECT_EQ(s.remote.streaming, 0);
  EXPECT_EQ(s.remote.damaged, 0u);
  EXPECT_EQ(s.recomputed, 0u);
  // The server that wrote it, restoring from its local storage (after: its turn would be written
  // to the store): the same logits, bit for bit.
  EXPECT_EQ(RestoreNext(m.get(), FakeOpts(dir_a, kv), "s", next), remote);
}

// The two damages the remote restore tests put on one chunk (key: good whole, bad its last layer
// flipped): round 0 stores bad; round 1 stores good, but the key goes from the store once the
// reader has taken its layer heads (HoldRangesAfter(1); the test erases it and releases).
void ArmChunkDamage(FakeRemoteKv* kv, const std::string& key, const std::string& good, const std::string& bad,
                    int round) {
  kv->Set(key, round == 0 ? bad : good);
  if (round == 1) kv->HoldRangesAfter(1);  // the heads pass; then the key goes
}

// good, the chunk value stored under key, with one bit flipped in the middle of its last layer's
// payload (where its own index places it); empty if it does not read.
std::string LastLayerFlipped(Model* m, const std::string& key, const std::string& good) {
  RemoteTierOptions ro;
  ro.store = std::make_shared<FakeRemoteKv>();  // only for the envelope
  std::unique_ptr<RemoteTier> t;
  std::string payload;
  if (!RemoteTier::Open(*m, T, "none", ro, [](uint64_t) { return std::string(); }, &t).ok() ||
      !t->Unwrap(RemoteTier::kChunk, key, good, &payload).ok())
    return std::string();
  const std::string f = test::TempDir() + "/remote-chunk-" + std::to_string(getpid()) + ".mzk";
  std::unique_ptr<SessionReader> r;
  if (!Env::Default()->WriteSmallFile(f, payload, true).ok() || !SessionReader::Open(*m, T, f, &r).ok()) return std::string();
  uint64_t off = 0, size = 0, hash = 0;
  int enc = 0;
  r->ChunkPlace(int(m->hparams().n_layer) - 1, 0, &off, &size, &hash, &enc);
  r.reset();
  std::filesystem::remove(f);
  std::string bad = good;
  bad[good.size() - payload.size() + off + size / 2] ^= 0x10;
  return bad;
}

// A chunk whose layer fails its check when it arrives (a bit flip in the store), or that the
// store loses mid-stream (evicted after its head was read), is never attended: its units are lost,
// the conversation's tokens are computed again, and the answer is still exact.
TEST(RemoteStream, ALayerFailingMidStreamIsComputedAgainNeverUsed) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  auto kv = std::make_shared<FakeRemoteKv>();
  const std::string dir_a = FreshDir("fa");
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 9, 8);
  const int32_t next = 55;
  Serve(m.get(), FakeOpts(dir_a, kv), "f", toks);
  const std::vector<float> want = Reference(m.get(), toks, {next});
  RemoteTierOptions ro;
  ro.store = kv;
  std::unique_ptr<RemoteTier> names;
  ASSERT_TRUE(RemoteTier::Open(*m, T, "none", ro, [](uint64_t) { return std::string(); }, &names).ok());
  const std::vector<uint64_t> h = ChainHashes(m->identity().header_hash, toks.data(), 3 * T, T);
  const std::string key = names->ChunkKey(h[1]);
  const std::string good = kv->Snapshot().at(key);
  const std::string manifest_key = names->ManifestKey("f");
  const std::string manifest = kv->Snapshot().at(manifest_key);  // each round's pool writes its turn back
  names.reset();
  const std::string bad = LastLayerFlipped(m.get(), key, good);
  ASSERT_FALSE(bad.empty());
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "bit flip in the last layer" : "evicted after its head was read");
    kv->Set(manifest_key, manifest);
    ArmChunkDamage(kv.get(), key, good, bad, round);
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(FreshDir("fb" + std::to_string(round)), kv), &b).ok());
    std::shared_ptr<Conversation> c;
    ASSERT_TRUE(b->OpenConversation("f", &c).ok());
    if (round == 1) {
      kv->Erase(key);
      kv->Release();
    }
    PipelineOptions po;
    RestoreGenerateStats rs;
    Status st = c->RestoreGenerate(&next, 1, po, &rs);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), want);
    for (int i = 0; i < 2000 && b->Stats().remote.streaming > 0; ++i)  // the good chunks' last layers
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const PoolStats s = b->Stats();
    EXPECT_EQ(s.remote.damaged, 1u);
    EXPECT_EQ(s.recomputed, 1u);
    EXPECT_EQ(s.remote.chunks_fetched, 2u);  // the two good chunks arrived whole
  }
}


// A request without a conversation id whose history the store holds by chain hash (a returning
// user on another server): its chunks stream in as a conversation opened by id does. Only their
// heads are fetched before the restore starts; restore_generate restores the first layers while
// the rest is still in the store (held after layer 0) and prefills the new tokens. Released, the
// logits equal those of a context that computed every token, and those of a pool that fetched the
// chunks whole before its prefill (the peer).
TEST(RemoteStream, PrefixFoundByChainHashStreamsFrontLayersFirstAndIsExact) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  auto kv = std::make_shared<FakeRemoteKv>();
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 20, 7);
  Serve(m.get(), FakeOpts(FreshDir("pa"), kv), "s", toks);
  std::vector<int32_t> q(toks.begin(), toks.begin() + 3 * T);  // the same history, another turn
  for (int i = 0; i < 25; ++i) q.push_back(400 + i);
  const std::vector<int32_t> first(q.begin(), q.begin() + 3 * T), rest(q.begin() + 3 * T, q.end());
  const std::vector<float> want = Reference(m.get(), first, rest);
  const int nv = int(m->hparams().n_vocab);

  kv->HoldRangesAfter(2);  // range call 0: the heads; 1: layer 0 of every chunk; 2 (layer 1) waits
  const std::string dir_b = FreshDir("pb");
  std::unique_ptr<Pool> b;
  ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(dir_b, kv), &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation("new", &c).ok());  // no such id in the store: an empty conversation
  EXPECT_EQ(c->n_tokens(), 0);
  std::vector<float> got;
  Status st;
  std::thread gen([&] {
    PipelineOptions po;
    RestoreGenerateStats rs;
    st = c->RestoreGenerate(q.data(), int(q.size()), po, &rs);
    if (st.ok()) got = Row(c->logits(0), nv);
  });
  // Readiness wait (not a timing): a layer-0 unit restored while layer 1 is held in the store.
  bool used_early = false;
  for (int i = 0; i < 4000 && !used_early; ++i) {
    const PoolStats s = b->Stats();
    used_early = s.shared.units_resident >= 1 && kv->range_calls() == 3 && s.remote.chunks_fetched == 0 &&
                 s.remote.streaming == 3;
    if (!used_early) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(used_early) << "no shared unit was restored while layer 1 was still held in the store";
  kv->Release();
  gen.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got, want);
  PoolStats s = b->Stats();
  EXPECT_EQ(s.remote.prefix_chunks, 3u);
  EXPECT_EQ(s.prefix_chunks_reused, 3u);
  EXPECT_EQ(s.remote.chunks_fetched, 3u);
  EXPECT_EQ(s.remote.streaming, 0);
  EXPECT_EQ(s.remote.damaged, 0u);
  EXPECT_EQ(s.recomputed, 0u);
  // Nothing of the streamed files is left in the pool's folder (the store holds them open).
  for (const auto& e : std::filesystem::directory_iterator(dir_b + "/swap"))
    EXPECT_EQ(e.path().filename().string().find("~remote-"), std::string::npos) << e.path();
  // A second new conversation on the same history borrows the chunks the store holds: nothing
  // fetched again.
  std::shared_ptr<Conversation> c2;
  ASSERT_TRUE(b->OpenConversation("new2", &c2).ok());
  PipelineOptions po;
  RestoreGenerateStats rs;
  ASSERT_TRUE(c2->RestoreGenerate(q.data(), int(q.size()), po, &rs).ok());
  EXPECT_EQ(Row(c2->logits(0), nv), want);
  EXPECT_EQ(b->Stats().remote.chunks_fetched, 3u);
  // The peer: fetched whole before the prefill. The same logits.
  PoolOptions wo = FakeOpts(FreshDir("pw"), kv);
  wo.remote.stream_prefix = false;
  std::unique_ptr<Pool> w;
  ASSERT_TRUE(Pool::Open(m.get(), wo, &w).ok());
  std::shared_ptr<Conversation> cw;
  ASSERT_TRUE(w->OpenConversation("new", &cw).ok());
  ASSERT_TRUE(cw->RestoreGenerate(q.data(), int(q.size()), po, &rs).ok());
  EXPECT_EQ(Row(cw->logits(0), nv), want);
  s = w->Stats();
  EXPECT_EQ(s.remote.prefix_chunks, 3u);
  EXPECT_EQ(s.remote.chunks_fetched, 3u);
}

// The same request when one of its chunks fails: a bit flip in its last layer (found when that
// layer arrives), or evicted by the store after its head was read. Never attended: its units are
// lost, the call computes its tokens again without the remote tier, and the answer is exact.
TEST(RemoteStream, APrefixChunkFailingMidStreamIsComputedAgainNeverUsed) {
  auto m = LoadModel();
  ASSERT_TRUE(m);
  auto kv = std::make_shared<FakeRemoteKv>();
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 9, 8);
  Serve(m.get(), FakeOpts(FreshDir("qa"), kv), "f", toks);
  std::vector<int32_t> q(toks.begin(), toks.begin() + 3 * T);
  for (int i = 0; i < 12; ++i) q.push_back(600 + i);
  const std::vector<int32_t> first(q.begin(), q.begin() + 3 * T), rest(q.begin() + 3 * T, q.end());
  const std::vector<float> want = Reference(m.get(), first, rest);
  RemoteTierOptions ro;
  ro.store = std::make_shared<FakeRemoteKv>();  // only for the key names
  std::unique_ptr<RemoteTier> names;
  ASSERT_TRUE(RemoteTier::Open(*m, T, "none", ro, [](uint64_t) { return std::string(); }, &names).ok());
  const std::vector<uint64_t> h = ChainHashes(m->identity().header_hash, toks.data(), 3 * T, T);
  const std::string key = names->ChunkKey(h[1]);
  const std::string good = kv->Snapshot().at(key);
  const std::string bad = LastLayerFlipped(m.get(), key, good);
  ASSERT_FALSE(bad.empty());
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "bit flip in the last layer" : "evicted after its head was read");
    ArmChunkDamage(kv.get(), key, good, bad, round);
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(FreshDir("qb" + std::to_string(round)), kv), &b).ok());
    std::shared_ptr<Conversation> c;
    ASSERT_TRUE(b->OpenConversation("g" + std::to_string(round), &c).ok());
    Status st;
    std::thread gen([&] {
      PipelineOptions po;
      RestoreGenerateStats rs;
      st = c->RestoreGenerate(q.data(), int(q.size()), po, &rs);
    });
    if (round == 1) {
      for (int i = 0; i < 4000 && kv->range_calls() < 2; ++i)  // the layers' first call is waiting
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      kv->Erase(key);
      kv->Release();
    }
    gen.join();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), want);
    for (int i = 0; i < 2000 && b->Stats().remote.streaming > 0; ++i)  // the good chunks' last layers
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const PoolStats s = b->Stats();
    EXPECT_EQ(s.remote.damaged, 1u);
    EXPECT_EQ(s.recomputed, 1u);
    EXPECT_EQ(s.remote.prefix_chunks, 3u);   // found and streamed ...
    EXPECT_EQ(s.remote.chunks_fetched, 2u);  // ... the two good chunks arrived whole
    EXPECT_EQ(c->n_tokens(), int(q.size()));
  }
}


// A chunk file still arriving when the process dies is partial on disk. Played with the Env's
// faults: a write of one chunk's first layer fails (EIO), so its stream stops there and its file
// at the chunk file's path holds only its head; the pool then goes away without reading it (as
// at a crash). The next start removes the chunk files that fetch placed (their marker lists them)
// and the marker; the conversation's tokens are computed again and the answer is exact. A removal
// that fails at start (EIO) keeps the files out of use and the marker for the next start.
TEST(RemoteStream, PartialChunkFileLeftAtACrashIsRemovedAtStart) {
  auto fenv = std::make_unique<FaultEnv>(Env::Default());
  std::unique_ptr<Model> m;
  ASSERT_TRUE(Model::Load(fenv.get(), ModelFile(), ModelOptions(), &m).ok());
  auto kv = std::make_shared<FakeRemoteKv>();
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 11, 9);
  const int32_t next = 66;
  Serve(m.get(), FakeOpts(FreshDir("ca"), kv), "p", toks);
  const std::vector<float> want = Reference(m.get(), toks, {next});
  const std::vector<uint64_t> h = ChainHashes(m->identity().header_hash, toks.data(), 3 * T, T);
  const std::string dir = FreshDir("cb");
  auto chunk = [&](int c) {
    char name[32];
    std::snprintf(name, sizeof name, "%016llx.mzk", static_cast<unsigned long long>(h[size_t(c)]));
    return dir + "/chunks/" + name;
  };
  auto markers = [&] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir + "/chunks"))
      n += e.path().filename().string().rfind("~partial-", 0) == 0;
    return n;
  };
  auto exists = [](const std::string& p) { return std::filesystem::exists(p); };
  {
    fenv->path_filter = "~remote-";  // the streamed files (their swap names at open)
    fenv->fail_writes_after = 3;     // the three heads pass; chunk 0's layer 0 fails
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(dir, kv), &b).ok());
    std::shared_ptr<Conversation> c;
    ASSERT_TRUE(b->OpenConversation("p", &c).ok());
    for (int i = 0; i < 2000 && b->Stats().remote.streaming > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(b->Stats().remote.chunks_fetched, 2u);
    fenv->fail_writes_after = -1;
  }  // gone without reading chunk 0: its file is partial, and marked so
  fenv->path_filter.clear();  // no pool thread reads it now
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(exists(chunk(c))) << c;
  EXPECT_EQ(markers(), 1);
  {
    // A start whose removals fail: the files are kept out of use, the marker stays.
    fenv->path_filter = ".mzk";
    fenv->fail_removes_after = 0;
    std::unique_ptr<Pool> b;
    ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(dir, kv), &b).ok());
    fenv->fail_removes_after = -1;
    const PoolStats s = b->Stats();
    EXPECT_EQ(s.partial_chunk_files_removed, 0u);
    EXPECT_EQ(s.chunk_files_damaged, 3u);  // named, not usable
    EXPECT_EQ(markers(), 1);
  }  // "p" was not opened: nothing persisted, the folder as it was
  fenv->path_filter.clear();
  PoolStats s;
  const std::vector<float> got = RestoreNext(m.get(), FakeOpts(dir, kv), "p", next, &s);
  EXPECT_EQ(s.partial_chunk_files_removed, 3u);
  EXPECT_EQ(s.chunk_files_damaged, 3u);
  EXPECT_EQ(s.recomputed, 1u);
  EXPECT_EQ(got, want);
  EXPECT_EQ(markers(), 0);
  // That pool persisted "p" with its turn, writing its chunk files again: the next start finds
  // every one whole.
  std::unique_ptr<Pool> d;
  ASSERT_TRUE(Pool::Open(m.get(), FakeOpts(dir, kv), &d).ok());
  const PoolStats s2 = d->Stats();
  EXPECT_EQ(s2.partial_chunk_files_removed, 0u);
  EXPECT_EQ(s2.chunk_files_damaged, 0u);
  for (int c = 0; c < 3; ++c) EXPECT_TRUE(exists(chunk(c))) << c;
}

// ---- Redis Cluster: a real 3-master cluster of redis-server on loopback ----

bool RedisCliPresent() { return access("/usr/bin/redis-cli", X_OK) == 0; }

bool PortFree(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  const bool ok = bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(s);
  return ok;
}

// A free port whose cluster bus port (port + 10000, which redis-server opens too) is free and
// valid: an ephemeral port above 55535 would make redis-server refuse to start.
int ClusterPort() {
  for (int i = 0; i < 200; ++i) {
    const int p = FreePort();
    if (p > 0 && p + 10000 <= 65535 && PortFree(p + 10000)) return p;
  }
  return 0;
}

// Keys a node holds (DBSIZE), asked of that node alone.
long long DbSize(int port) {
  const std::string cmd = "redis-cli -p " + std::to_string(port) + " DBSIZE 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return -1;
  char buf[64] = {0};
  const bool got = fgets(buf, sizeof buf, f) != nullptr;
  pclose(f);
  return got ? std::atoll(buf) : -1;
}

// A shell command's output, whitespace trimmed at the end ("" when it cannot run).
std::string ShellOut(const std::string& cmd) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return "";
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
  return out;
}

// Three masters (no replicas), every slot assigned, the cluster's state ok on each node: the
// nodes started in `nodes` (a test's fatal failure when it does not come up). With tls: TLS ports
// only, the cluster bus over TLS too (tls-cluster: CLUSTER SLOTS and redirections name TLS ports).
void StartCluster(RedisServer (&nodes)[3], const TestCerts* tls = nullptr) {
  const std::string cli = tls ? "redis-cli --tls --cacert " + tls->cert : std::string("redis-cli");
  std::string create = cli + " --cluster create";
  const std::vector<std::string> cluster = {"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                            "--cluster-node-timeout", "5000"};
  for (auto& n : nodes) {
    if (tls) {
      std::vector<std::string> extra = cluster;
      extra.insert(extra.end(), {"--tls-cluster", "yes"});
      ASSERT_TRUE(n.StartTls(*tls, "optional", 0, ClusterPort(), extra));
    } else {
      ASSERT_TRUE(n.Start(ClusterPort(), cluster));
    }
    create += " 127.0.0.1:" + std::to_string(tls ? n.tls_port() : n.port());
  }
  create += " --cluster-replicas 0 --cluster-yes > /dev/null 2>&1";
  ASSERT_EQ(std::system(create.c_str()), 0) << create;
  bool ok = false;  // readiness wait: every node agrees the cluster is up
  for (int i = 0; i < 500 && !ok; ++i) {
    ok = true;
    for (auto& n : nodes) {
      const std::string q = cli + " -p " + std::to_string(tls ? n.tls_port() : n.port()) +
                            " CLUSTER INFO 2>/dev/null | grep -q cluster_state:ok";
      ok = ok && std::system(q.c_str()) == 0;
    }
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ok) << "the cluster did not come up";
}

// Server B: a pool on the fresh folder dir, reading through url, opens conversation id that another
// server wrote. Its history must be toks, and next decoded after it must give the logits of a plain
// context that computed both (exact: lossless codecs), the manifest and `chunks` chunks fetched from
// the remote tier and nothing recomputed, damaged or degraded. B's stats in *out.
void ContinueElsewhere(Model* m, const std::string& dir, const std::string& url, const std::string& id,
                       const std::vector<int32_t>& toks, const std::vector<int32_t>& next, uint64_t chunks,
                       PoolStats* out, const std::string& ca_file = "") {
  std::unique_ptr<Pool> b;
  PoolOptions o = Opts(dir, url);
  o.remote.ca_file = ca_file;
  ASSERT_TRUE(Pool::Open(m, o, &b).ok());
  std::shared_ptr<Conversation> c;
  ASSERT_TRUE(b->OpenConversation(id, &c).ok());
  std::vector<int32_t> hist;
  ASSERT_TRUE(b->History(id, &hist).ok());
  EXPECT_EQ(hist, toks);
  ASSERT_TRUE(c->Decode(next.data(), int(next.size()), false).ok());
  EXPECT_EQ(Row(c->logits(0), int(m->hparams().n_vocab)), Reference(m, toks, next));
  *out = b->Stats();
  EXPECT_EQ(out->remote.manifest_hits, 1u);
  EXPECT_EQ(out->remote.chunks_fetched, chunks);
  EXPECT_EQ(out->recomputed, 0u);
  EXPECT_EQ(out->remote.damaged, 0u);
  EXPECT_FALSE(out->remote.degraded) << out->remote.last_error;
}

TEST(RemoteCluster, AnotherServerContinuesTheConversationThroughACluster) {
  NEED_REDIS();
  if (!RedisCliPresent()) GTEST_SKIP() << "redis-cli is not installed";
  RedisServer nodes[3];
  StartCluster(nodes);
  if (HasFatalFailure()) return;
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 5 * T + 20, 11), next = {31, 32, 33};
  // Server A writes through node 0, server B reads through node 1: each key lives on its slot's
  // master, reached by the MOVED redirections and the slot map.
  Serve(m.get(), Opts(FreshDir("ca"), nodes[0].Url()), "chat-c", toks);
  long long held = 0, nodes_with_keys = 0;
  for (auto& n : nodes) {
    const long long k = DbSize(n.port());
    held += k;
    nodes_with_keys += k > 0;
  }
  EXPECT_EQ(held, 6);                // 5 chunks and the manifest, each on its own slot's master
  EXPECT_GE(nodes_with_keys, 2);     // spread over the masters (slots by hash tag)
  PoolStats s;
  ContinueElsewhere(m.get(), FreshDir("cb"), nodes[1].Url(), "chat-c", toks, next, 5, &s);
  if (HasFatalFailure()) return;
  // The census counts every master's keys.
  std::unique_ptr<RemoteKv> kv = nodes[2].Client();
  uint64_t keys = 0, bytes = 0;
  ASSERT_TRUE(kv->Census("mz:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 6u);
}

// The same over TLS: every node serves a TLS port only and the cluster bus is TLS too, so the slot
// map and the MOVED redirections name TLS ports, and each connection the client opens to a master
// (from the map or a redirection) is verified against the CA file, as the first one is.
TEST(RemoteCluster, AnotherServerContinuesTheConversationThroughATlsCluster) {
  NEED_TLS();
  if (!RedisCliPresent()) GTEST_SKIP() << "redis-cli is not installed";
  RedisServer nodes[3];
  StartCluster(nodes, &certs);
  if (HasFatalFailure()) return;
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 5 * T + 20, 13), next = {41, 42, 43};
  PoolOptions oa = Opts(FreshDir("tca"), nodes[0].Url());
  oa.remote.ca_file = certs.cert;
  Serve(m.get(), oa, "chat-t", toks);
  PoolStats s;
  ContinueElsewhere(m.get(), FreshDir("tcb"), nodes[1].Url(), "chat-t", toks, next, 5, &s, certs.cert);
  if (HasFatalFailure()) return;
  EXPECT_EQ(s.remote.address.rfind("rediss://", 0), 0u) << s.remote.address;
  std::unique_ptr<RemoteKv> kv = nodes[2].Client();  // the census asks every master, over TLS
  uint64_t keys = 0, bytes = 0;
  ASSERT_TRUE(kv->Census("mz:*", &keys, &bytes).ok());
  EXPECT_EQ(keys, 6u);  // 5 chunks and the manifest
  // Spread over the masters: each node's own count (DBSIZE over TLS).
  int nodes_with_keys = 0;
  for (auto& n : nodes) {
    const std::string q = "redis-cli --tls --cacert " + certs.cert + " -p " + std::to_string(n.tls_port()) + " DBSIZE";
    nodes_with_keys += std::atoll(ShellOut(q + " 2>/dev/null").c_str()) > 0;
  }
  EXPECT_GE(nodes_with_keys, 2);
}

// A slot being migrated (resharding in progress): the manifest's slot and a chunk's slot are each
// MIGRATING on their owner and IMPORTING on another master, and those two keys already moved, so
// their owners answer ASK. Server B, reading through a third node, follows the ASK (ASKING, then
// the command, on the node it names) for the manifest and the streamed chunk reads alike, and
// continues the conversation exactly.
TEST(RemoteCluster, AskRedirectionDuringAMigrationIsFollowed) {
  NEED_REDIS();
  if (!RedisCliPresent()) GTEST_SKIP() << "redis-cli is not installed";
  RedisServer nodes[3];
  StartCluster(nodes);
  if (HasFatalFailure()) return;
  auto m = LoadModel();
  ASSERT_TRUE(m);
  const std::vector<int32_t> toks = Tokens(0, 3 * T + 20, 12), next = {41, 42, 43};
  Serve(m.get(), Opts(FreshDir("aa"), nodes[0].Url()), "chat-ask", toks);
  auto cli = [](int port) { return "redis-cli -p " + std::to_string(port) + " "; };
  // Each node's keys; the manifest and one chunk are the keys to migrate.
  std::string manifest, chunk;
  int manifest_node = -1, chunk_node = -1;
  for (int i = 0; i < 3; ++i) {
    std::string keys = ShellOut(cli(nodes[i].port()) + "--scan --pattern 'mz:*' 2>/dev/null");
    size_t pos = 0;
    while (pos < keys.size()) {
      size_t e = keys.find('\n', pos);
      if (e == std::string::npos) e = keys.size();
      const std::string k = keys.substr(pos, e - pos);
      pos = e + 1;
      if (k.find(":m:") != std::string::npos) manifest = k, manifest_node = i;
      else if (k.find(":k:") != std::string::npos && chunk.empty()) chunk = k, chunk_node = i;
    }
  }
  ASSERT_GE(manifest_node, 0);
  ASSERT_GE(chunk_node, 0);
  int migrated = 0;
  for (auto [key, src] : {std::pair{manifest, manifest_node}, std::pair{chunk, chunk_node}}) {
    const int dst = (src + 1) % 3;
    const std::string slot = ShellOut(cli(nodes[src].port()) + "CLUSTER KEYSLOT '" + key + "'");
    const std::string src_id = ShellOut(cli(nodes[src].port()) + "CLUSTER MYID");
    const std::string dst_id = ShellOut(cli(nodes[dst].port()) + "CLUSTER MYID");
    ASSERT_FALSE(slot.empty() || src_id.empty() || dst_id.empty());
    const std::string state = ShellOut(cli(nodes[src].port()) + "CLUSTER COUNTKEYSINSLOT " + slot);
    ASSERT_EQ(state, "1") << "slot " << slot << " holds other keys too";
    ASSERT_EQ(ShellOut(cli(nodes[dst].port()) + "CLUSTER SETSLOT " + slot + " IMPORTING " + src_id), "OK");
    ASSERT_EQ(ShellOut(cli(nodes[src].port()) + "CLUSTER SETSLOT " + slot + " MIGRATING " + dst_id), "OK");
    ASSERT_EQ(ShellOut(cli(nodes[src].port()) + "MIGRATE 127.0.0.1 " + std::to_string(nodes[dst].port()) + " '" + key +
                       "' 0 5000"),
              "OK");
    // The source answers ASK for it now (a plain client, no ASKING: the redirection itself).
    EXPECT_EQ(ShellOut(cli(nodes[src].port()) + "EXISTS '" + key + "' 2>&1").rfind("ASK", 0), 0u) << key;
    ++migrated;
  }
  ASSERT_EQ(migrated, 2);
  PoolStats s;
  ContinueElsewhere(m.get(), FreshDir("ab"), nodes[2].Url(), "chat-ask", toks, next, 3, &s);
}

// ---- the pipeline's reply reader (store/resp_reply.h): scripted bytes, no server ----
#if MZ_HAVE_HIREDIS

// A reply stream, delivered first in a piece of `first` bytes, then in pieces of at most `step`
// (each read also capped by what the reader asks for); at the end: "closed".
struct Script {
  std::string bytes;
  size_t first = 0, step = 1, at = 0;
  RespSource Source() {
    return [this](char* buf, size_t cap, size_t* got) {
      if (at == bytes.size()) return Status::IOError("closed");
      size_t n = std::min(cap, bytes.size() - at);
      n = std::min(n, at == 0 && first > 0 ? first : step);
      std::memcpy(buf, bytes.data() + at, n);
      at += n;
      *got = n;
      return Status::Ok();
    };
  }
};

struct Reader {
  redisReader* r = redisReaderCreate();
  ~Reader() { redisReaderFree(r); }
};

// What a reply reads as, for comparison: "bulk:<bytes>", or hiredis's type and text or integer.
std::string Show(const RespReply& x) {
  if (x.is_bulk()) return "bulk:" + x.bulk;
  const redisReply* r = x.reply.get();
  std::string s = "type" + std::to_string(r->type) + ":";
  if (r->type == REDIS_REPLY_INTEGER) return s + std::to_string(r->integer);
  if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; ++i) s += std::string(r->element[i]->str ? r->element[i]->str : "") + ",";
    return s;
  }
  return s + (r->str ? std::string(r->str, size_t(r->len)) : "");
}

// A pipeline's replies of every kind, with bulks below and above the reader's 64 KiB reads.
std::vector<std::pair<std::string, std::string>> Replies() {
  std::string big(70001, '\0'), mid(5000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 131 + 7);
  for (size_t i = 0; i < mid.size(); ++i) mid[i] = char(i % 251);
  mid[100] = '\r';  // CRLF inside a payload is data
  mid[101] = '\n';
  return {{"+OK\r\n", "type5:OK"},
          {":42\r\n", "type3:42"},
          {"$5\r\nhello\r\n", "bulk:hello"},
          {"$-1\r\n", "type4:"},
          {"$0\r\n\r\n", "bulk:"},
          {"-MOVED 3999 127.0.0.1:6381\r\n", "type6:MOVED 3999 127.0.0.1:6381"},
          {"*2\r\n$1\r\na\r\n$2\r\nbc\r\n", "type2:a,bc,"},
          {"$" + std::to_string(mid.size()) + "\r\n" + mid + "\r\n", "bulk:" + mid},
          {"$" + std::to_string(big.size()) + "\r\n" + big + "\r\n", "bulk:" + big},
          {":-7\r\n", "type3:-7"}};
}

// Reads every reply of s through one reader; false (with the first difference) when any differs.
::testing::AssertionResult ReadsAll(Script& s, const std::vector<std::pair<std::string, std::string>>& want) {
  Reader rd;
  const RespSource src = s.Source();
  for (size_t i = 0; i < want.size(); ++i) {
    RespReply x;
    const Status st = ReadRespReply(rd.r, src, &x);
    if (!st.ok()) return ::testing::AssertionFailure() << "reply " << i << ": " << st.ToString();
    if (Show(x) != want[i].second)
      return ::testing::AssertionFailure() << "reply " << i << " differs (" << Show(x).substr(0, 40) << ")";
  }
  if (s.at != s.bytes.size()) return ::testing::AssertionFailure() << "bytes left unread";
  if (rd.r->len - rd.r->pos != 0) return ::testing::AssertionFailure() << "bytes left in the reader";
  return ::testing::AssertionSuccess();
}

TEST(RespReply, EveryReplyReadsTheSameWhereverTheReadsSplitIt) {
  const auto want = Replies();
  Script s;
  for (const auto& w : want) s.bytes += w.first;
  // One byte per read: every boundary inside every header, payload and CRLF.
  s.step = 1;
  ASSERT_TRUE(ReadsAll(s, want));
  // A first read ending at each byte of the small replies and of the big bulk's edges (every
  // 1009th byte inside it), the rest in reads of 3 bytes, then of 64 KiB.
  const size_t big_at = s.bytes.size() - want.back().first.size() - want[want.size() - 2].first.size();
  for (size_t step : {size_t(3), size_t(1) << 16})
    for (size_t k = 1; k <= s.bytes.size(); k += (k < big_at + 64 || k > s.bytes.size() - 64) ? 1 : 1009) {
      s.at = 0;
      s.first = k;
      s.step = step;
      ASSERT_TRUE(ReadsAll(s, want)) << "first read " << k << " bytes, then " << step;
    }
}

TEST(RespReply, MalformedOrCutRepliesAreClearErrorsNeverAValue) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"$abc\r\n", "malformed"},
      {"$\r\n", "malformed"},
      {"$-2\r\n", "malformed"},
      {"$5\rX", "malformed"},
      {"$123456789012345678\r\n", "malformed"},
      {"$4294967297\r\nxx", "malformed"},  // above kRespMaxBulk
      {"$5\r\nhelloXY", "malformed"},       // no CRLF after the payload
      {"$5\r\nhel", "closed"},              // the connection dropped inside the payload
      {"$5", "closed"},                       // ... inside the header
      {"?what\r\n", "malformed"},           // hiredis: protocol error
      {"*2\r\n:1\r\n", "closed"},         // an array cut short
  };
  for (const auto& b : bad)
    for (size_t step : {size_t(1), size_t(1) << 16}) {
      Script s;
      s.bytes = b.first;
      s.step = step;
      Reader rd;
      RespReply x;
      const Status st = ReadRespReply(rd.r, s.Source(), &x);
      EXPECT_EQ(st.code(), Status::kIOError) << b.first;
      EXPECT_NE(st.message().find(b.second), std::string::npos) << b.first << ": " << st.ToString();
    }
}

// RedisKv against a real server: values of every size around the reader's reads read back exactly,
// missing keys as nil, ranges as GETRANGE answers them, and a bad reply (GET of a list) is an error
// that leaves the connection usable.
TEST(RespReply, RedisValuesOfEverySizeReadBackExactly) {
  NEED_REDIS();
  if (!RedisCliPresent()) GTEST_SKIP() << "redis-cli is not installed";
  RedisServer redis;
  ASSERT_TRUE(redis.Start());
  RedisOptions ro;
  ASSERT_TRUE(ParseRemoteUrl(redis.Url(), &ro.url).ok());
  std::unique_ptr<RemoteKv> kv;
  ASSERT_TRUE(OpenRedisKv(ro, &kv).ok());
  std::vector<std::string> keys, want;
  for (size_t n : {size_t(0), size_t(1), size_t(13), size_t(65533), size_t(65536), size_t(65539), size_t(3u << 20) + 5}) {
    std::string v(n, '\0');
    for (size_t i = 0; i < n; ++i) v[i] = char((i * 7919) >> 3);
    keys.push_back("mz:test:{" + std::to_string(n) + "}");
    want.push_back(v);
    ASSERT_TRUE(kv->Put(keys.back(), v, 60, false).ok());
  }
  keys.push_back("mz:test:{missing}");
  std::vector<std::optional<std::string>> got;
  ASSERT_TRUE(kv->Get(keys, &got).ok());
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].has_value()) << keys[i];
    EXPECT_TRUE(*got[i] == want[i]) << keys[i];
  }
  EXPECT_FALSE(got.back().has_value());
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (size_t i = 0; i < keys.size(); ++i) ranges.push_back({1, 70000});
  std::vector<std::string> part;
  std::vector<uint64_t> sizes;
  ASSERT_TRUE(kv->GetRange(keys, ranges, &part, &sizes).ok());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(sizes[i], want[i].size());
    EXPECT_TRUE(part[i] == (want[i].size() > 1 ? want[i].substr(1, 70000) : "")) << keys[i];
  }
  ASSERT_EQ(system(("redis-cli -p " + std::to_string(redis.port()) + " RPUSH mz:test:list a >/dev/null 2>&1").c_str()), 0);
  const Status st = kv->Get({keys[1], "mz:test:list", keys[2]}, &got);
  EXPECT_EQ(st.code(), Status::kIOError);
  EXPECT_NE(st.message().find("WRONGTYPE"), std::string::npos) << st.ToString();
  ASSERT_TRUE(kv->Get({keys[2]}, &got).ok());
  EXPECT_TRUE(got[0] && *got[0] == want[2]);
}
#endif  // MZ_HAVE_HIREDIS

}  // namespace
}  // namespace mz
