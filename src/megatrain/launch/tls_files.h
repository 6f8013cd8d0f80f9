// The dashboard's certificate and private key (`megatrain launch --dashboard-tls-cert FILE --dashboard-tls-key
// FILE`), checked before the server starts. cpp-httplib's SSLServer only says "not valid" when its context cannot
// be built, and starts with a certificate that expired long ago (every client then refuses it, and the job runs on
// with a dashboard no one can read). So each way a pair can be unusable is named here, with the file it is in.
#pragma once
#include <string>

namespace mt::launch {

struct TlsFiles {
  std::string cert;  // PEM: the server's certificate first, then any intermediates (a chain file)
  std::string key;   // PEM: the certificate's private key, unencrypted, readable by its owner only
  bool enabled() const { return !cert.empty(); }
};

struct TlsCertInfo {
  std::string subject;    // "CN=node00.example.org"
  std::string not_after;  // "2027-11-28 06:00:00 UTC"
  double days_left = 0;   // until not_after
  double expires_at = 0;  // not_after in seconds since the Unix epoch
};

// Throws mt::Error (Config) naming the file and the problem: a file that cannot be read; a key readable by its group
// or others (mode 600, as for the token); no PEM certificate in `cert`; no private key in `key`, or an encrypted one
// (no passphrase is asked for: a supervisor has no one to ask); a key that is not the certificate's; a certificate
// not yet valid or expired. Returns what the log line says of the certificate.
TlsCertInfo check_tls_files(const TlsFiles& files);

}  // namespace mt::launch
