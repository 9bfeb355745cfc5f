// TLS for the remote tier's Redis connections (rediss://): OpenSSL (Debian's libssl, 3.0) running
// TLS 1.2+ over an Env socket (env/env.h Socket), so that every byte still goes through the Env
// (FaultEnv's socket faults reach TLS connections too) and the bulk reader (store/resp_reply.h)
// reads decrypted bytes the same way it reads a plain socket. The only file that calls OpenSSL.
// Only with OpenSSL (MZ_HAVE_OPENSSL); without it TlsClient::Create is kUnsupported.
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "env/env.h"

namespace mz {

struct TlsOptions {
  // PEM file of the certificate authorities to trust. Empty: the system's store (the file
  // $SSL_CERT_FILE names, else OpenSSL's default, Debian's /etc/ssl/certs/ca-certificates.crt).
  std::string ca_file;
  // A client certificate (PEM; more certificates after the first are its chain) and its private
  // key (PEM, unencrypted), for a server that asks for one (redis's tls-auth-clients). Both or
  // neither.
  std::string cert_file, key_file;
};

// A client context: the trusted CAs and the client certificate, loaded once (the files are read
// through the Env); then one Connect per connection. Thread-safe (Connect from any thread).
class TlsClient {
 public:
  // Reads the files through env (kept: env must outlive the client; used by Connect's sockets).
  // Errors, naming the file: unreadable (its OS error), not PEM or no certificate in it, a key that
  // does not match the certificate, only one of cert_file / key_file (kInvalidArgument);
  // kUnsupported without OpenSSL. kNoMemory when OpenSSL cannot make its context.
  static Status Create(Env* env, const TlsOptions& opts, std::unique_ptr<TlsClient>* out);
  virtual ~TlsClient() = default;
  // A TLS connection to host:port: a TCP connection through the Env (timeout_ms for the connect
  // and every later wait, handshake included), then the handshake: TLS 1.2 or later, the server's
  // certificate verified against the trusted CAs and checked to name host (a DNS name, or an IP
  // literal against the certificate's IP addresses); SNI carries a DNS host. *out then reads and
  // writes application data. Errors (kIOError, "TLS ... host:port: ..."): the connection's;
  // "certificate verify failed: <why>" (an untrusted or expired certificate); "the certificate
  // does not name <host>"; a handshake that fails otherwise, with OpenSSL's reason and, for a peer
  // that does not speak TLS (a plain Redis port: wrong version number, closed, timed out), a hint
  // to use redis://. Never a hang: every wait is bounded by timeout_ms.
  virtual Status Connect(const std::string& host, int port, uint32_t timeout_ms, std::unique_ptr<Socket>* out) = 0;
};

}  // namespace mz
