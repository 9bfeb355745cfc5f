#include "store/tls_stream.h"

#if MZ_HAVE_OPENSSL
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <mutex>

namespace mz {
namespace tls_stream {

// The reason of OpenSSL's last queued error (the queue is emptied), "" when there is none.
std::string TakeError(unsigned long* code = nullptr) {
  unsigned long e = 0, last = 0;
  while ((e = ERR_get_error()) != 0) last = e;
  if (code) *code = last;
  if (!last) return "";
  const char* r = ERR_reason_error_string(last);
  if (r) return r;
  char buf[256];
  ERR_error_string_n(last, buf, sizeof buf);
  return buf;
}

// The socket under a TLS connection, as OpenSSL sees it (a BIO): reads and writes go to the Env's
// socket; its error (a timeout, the peer closing) is kept so that messages name it rather than
// OpenSSL's "unexpected eof".
struct Link {
  Socket* sock = nullptr;
  Status last;
};

int LinkWrite(BIO* b, const char* data, size_t n, size_t* written) {
  Link* l = static_cast<Link*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  *written = 0;
  Status st = l->sock->WriteAll(data, n);
  if (!st.ok()) {
    l->last = st;
    return 0;
  }
  *written = n;
  return 1;
}

int LinkRead(BIO* b, char* buf, size_t n, size_t* got) {
  Link* l = static_cast<Link*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  Status st = l->sock->ReadSome(buf, n, got);
  if (!st.ok()) {
    l->last = st;
    *got = 0;
    return 0;
  }
  return 1;
}

long LinkCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int LinkCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

// The BIO method, made once for the process (never freed: OpenSSL's objects may use it to the end).
BIO_METHOD* LinkMethod() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* x = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "mz env socket");
    if (x) {
      BIO_meth_set_write_ex(x, LinkWrite);
      BIO_meth_set_read_ex(x, LinkRead);
      BIO_meth_set_ctrl(x, LinkCtrl);
      BIO_meth_set_create(x, LinkCreate);
    }
    return x;
  }();
  return m;
}

int NoPassword(char*, int, int, void*) { return 0; }  // an encrypted key is refused, never prompted for

// Every certificate of a PEM text: its count (0: none, or not PEM).
template <typename F>
int EachCert(const std::string& pem, F&& f) {
  BIO* b = BIO_new_mem_buf(pem.data(), int(pem.size()));
  if (!b) return 0;
  int n = 0;
  while (X509* x = PEM_read_bio_X509(b, nullptr, NoPassword, nullptr)) {
    f(x);  // takes x
    ++n;
  }
  ERR_clear_error();  // the end of the text reads as an error
  BIO_free(b);
  return n;
}

class TlsSocket final : public Socket {
 public:
  explicit TlsSocket(std::unique_ptr<Socket> plain) : plain_(std::move(plain)) { link_.sock = plain_.get(); }
  ~TlsSocket() override {
    if (ssl_) {
      if (!broken_) (void)SSL_shutdown(ssl_);  // our close_notify, not waiting for the server's
      SSL_free(ssl_);                          // and its BIO
    }
    ERR_clear_error();
  }

  Status Start(SSL_CTX* ctx, const std::string& host) {
    ssl_ = SSL_new(ctx);
    BIO* bio = ssl_ ? BIO_new(LinkMethod()) : nullptr;
    if (!bio) return Status::NoMemory("a TLS connection");
    BIO_set_data(bio, &link_);
    SSL_set_bio(ssl_, bio, bio);
    X509_VERIFY_PARAM* vp = SSL_get0_param(ssl_);
    X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (ASN1_OCTET_STRING* ip = a2i_IPADDRESS(host.c_str())) {  // an IP literal: checked against IP SANs
      ASN1_OCTET_STRING_free(ip);
      if (X509_VERIFY_PARAM_set1_ip_asc(vp, host.c_str()) != 1) return Status::InvalidArgument("TLS: bad address " + host);
    } else if (SSL_set1_host(ssl_, host.c_str()) != 1 || SSL_set_tlsext_host_name(ssl_, host.c_str()) != 1) {
      return Status::InvalidArgument("TLS: bad host name " + host);
    }
    ERR_clear_error();
    if (SSL_connect(ssl_) == 1) return Status::Ok();
    broken_ = true;
    const std::string where = "TLS handshake with " + peer();
    const long v = SSL_get_verify_result(ssl_);
    unsigned long code = 0;
    const std::string why = TakeError(&code);
    if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
      return Status::IOError(where + ": the certificate does not name " + host + " (hostname check failed)");
    if (v != X509_V_OK) return Status::IOError(where + ": certificate verify failed: " + X509_verify_cert_error_string(v));
    const std::string hint = " (is " + peer() + " a plain Redis port, without TLS? then use redis://)";
    if (!link_.last.ok()) return Status::IOError(where + ": " + link_.last.message() + hint);
    const bool not_tls = ERR_GET_REASON(code) == SSL_R_WRONG_VERSION_NUMBER ||
                         ERR_GET_REASON(code) == SSL_R_PACKET_LENGTH_TOO_LONG ||
                         ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
    return Status::IOError(where + ": " + (why.empty() ? std::string("failed") : why) + (not_tls ? hint : ""));
  }

  Status WriteAll(const void* buf, size_t n) override {
    if (n == 0) return Status::Ok();
    ERR_clear_error();
    size_t w = 0;
    if (SSL_write_ex(ssl_, buf, n, &w) == 1 && w == n) return Status::Ok();
    return Fail("sending to");
  }

  Status ReadSome(void* buf, size_t cap, size_t* got) override {
    *got = 0;
    ERR_clear_error();
    if (SSL_read_ex(ssl_, buf, cap, got) == 1 && *got > 0) return Status::Ok();
    *got = 0;
    if (SSL_get_error(ssl_, 0) == SSL_ERROR_ZERO_RETURN) {
      broken_ = true;
      return Status::IOError("the server closed the connection (TLS close_notify)");
    }
    return Fail("reading from");
  }

  const std::string& peer() const override { return plain_->peer(); }

 private:
  Status Fail(const char* what) {
    broken_ = true;
    const std::string why = TakeError();
    if (!link_.last.ok()) return link_.last;  // the socket's own error (timed out, closed)
    return Status::IOError(std::string("TLS: ") + what + " " + peer() + ": " + (why.empty() ? "failed" : why));
  }

  std::unique_ptr<Socket> plain_;
  Link link_;
  SSL* ssl_ = nullptr;
  bool broken_ = false;  // no close_notify: the connection failed
};

class OpenSslClient final : public TlsClient {
 public:
  OpenSslClient(Env* env, SSL_CTX* ctx) : env_(env), ctx_(ctx) {}
  ~OpenSslClient() override { SSL_CTX_free(ctx_); }

  Status Connect(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) override {
    out->reset();
    std::unique_ptr<Socket> plain;
    MZ_RETURN_IF_ERROR(env_->ConnectTcp(host, port, timeout_ms, &plain));
    auto s = std::make_unique<TlsSocket>(std::move(plain));
    MZ_RETURN_IF_ERROR(s->Start(ctx_, host));
    *out = std::move(s);
    return Status::Ok();
  }

 private:
  Env* env_;
  SSL_CTX* ctx_;
};

// The trusted CAs: ca_file's, else the system store's file (read through the Env).
Status LoadCas(Env* env, SSL_CTX* ctx, const std::string& ca_file) {
  std::string path = ca_file, what = "the remote's CA file " + ca_file;
  if (path.empty()) {
    MZ_RETURN_IF_ERROR(env->GetEnvVar(X509_get_default_cert_file_env(), &path));
    if (path.empty()) path = X509_get_default_cert_file();
    what = "the system's certificate authorities " + path + " (install ca-certificates, or name a CA file)";
  }
  std::string pem;
  MZ_RETURN_IF_ERROR(env->ReadSmallFile(path, &pem).With(what));
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  const int n = EachCert(pem, [&](X509* x) {
    (void)X509_STORE_add_cert(store, x);  // a duplicate is no error
    X509_free(x);
  });
  if (n == 0) return Status::InvalidArgument(what + ": no PEM certificate in it");
  return Status::Ok();
}

Status LoadClientCert(Env* env, SSL_CTX* ctx, const TlsOptions& o) {
  std::string pem, key;
  MZ_RETURN_IF_ERROR(env->ReadSmallFile(o.cert_file, &pem).With("the remote's client certificate file"));
  MZ_RETURN_IF_ERROR(env->ReadSmallFile(o.key_file, &key).With("the remote's client key file"));
  bool first = true, ok = true;
  const int n = EachCert(pem, [&](X509* x) {
    if (first) {
      ok = SSL_CTX_use_certificate(ctx, x) == 1 && ok;
      X509_free(x);
      first = false;
    } else if (SSL_CTX_add0_chain_cert(ctx, x) != 1) {  // takes x when it succeeds
      X509_free(x);
      ok = false;
    }
  });
  if (n == 0) return Status::InvalidArgument("the remote's client certificate file " + o.cert_file + ": no PEM certificate in it");
  if (!ok) return Status::InvalidArgument("the remote's client certificate file " + o.cert_file + ": " + TakeError());
  BIO* b = BIO_new_mem_buf(key.data(), int(key.size()));
  EVP_PKEY* k = b ? PEM_read_bio_PrivateKey(b, nullptr, NoPassword, nullptr) : nullptr;
  BIO_free(b);
  if (!k)
    return Status::InvalidArgument("the remote's client key file " + o.key_file +
                                   ": no unencrypted PEM private key in it (" + TakeError() + ")");
  ok = SSL_CTX_use_PrivateKey(ctx, k) == 1;
  EVP_PKEY_free(k);
  if (!ok || SSL_CTX_check_private_key(ctx) != 1)
    return Status::InvalidArgument("the remote's client key file " + o.key_file + " does not match the certificate " +
                                   o.cert_file + " (" + TakeError() + ")");
  return Status::Ok();
}

}  // namespace tls_stream

Status TlsClient::Create(Env* env, const TlsOptions& opts, std::unique_ptr<TlsClient>* out) {
  using namespace tls_stream;
  out->reset();
  if (opts.cert_file.empty() != opts.key_file.empty())
    return Status::InvalidArgument("a TLS client certificate needs both its certificate file and its key file");
  if (!LinkMethod()) return Status::NoMemory("OpenSSL's BIO method");
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return Status::NoMemory("a TLS context: " + TakeError());
  auto c = std::make_unique<OpenSslClient>(env, ctx);  // owns ctx from here
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  MZ_RETURN_IF_ERROR(LoadCas(env, ctx, opts.ca_file));
  if (!opts.cert_file.empty()) MZ_RETURN_IF_ERROR(LoadClientCert(env, ctx, opts));
  *out = std::move(c);
  return Status::Ok();
}

}  // namespace mz

#else  // !MZ_HAVE_OPENSSL

namespace mz {
Status TlsClient::Create(Env*, const TlsOptions&, std::unique_ptr<TlsClient>* out) {
  out->reset();
  return Status::Unsupported("TLS (rediss://): this build has no OpenSSL (install libssl-dev and rebuild)");
}
}  // namespace mz

#endif
