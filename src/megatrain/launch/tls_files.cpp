#include "megatrain/launch/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>

#include "megatrain/core/error.h"

namespace mt::launch {
namespace {

struct Closer {
  void operator()(FILE* f) const { std::fclose(f); }
  void operator()(X509* x) const { X509_free(x); }
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  void operator()(BIO* b) const { BIO_free(b); }
};
template <class T>
using Owned = std::unique_ptr<T, Closer>;

Owned<FILE> open_pem(const std::string& path, const char* what) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) fail_as(ErrorKind::Config, "--dashboard-tls-{} {}: {}", what, path, std::strerror(errno));
  return Owned<FILE>(f);
}

// Called by OpenSSL for an encrypted key's passphrase. No one is there to type it (the default callback would
// prompt on the terminal, or block a supervisor started in the background): note that it was asked, and refuse.
int no_passphrase(char*, int, int, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}

std::string utc_text(const std::tm& tm) {
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string time_text(const ASN1_TIME* t) {
  std::tm tm{};
  return ASN1_TIME_to_tm(t, &tm) == 1 ? utc_text(tm) : "(an unreadable time)";
}

}  // namespace

TlsCertInfo check_tls_files(const TlsFiles& files) {
  MT_CHECK(!files.cert.empty() && !files.key.empty(), "--dashboard-tls-cert and --dashboard-tls-key go together");
  // The key first: a key others can read must not be used at all, whatever else is wrong.
  struct stat st {};
  if (::stat(files.key.c_str(), &st) != 0)
    fail_as(ErrorKind::Config, "--dashboard-tls-key {}: {}", files.key, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_as(ErrorKind::Config, "--dashboard-tls-key {} is not a regular file", files.key);
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    fail_as(ErrorKind::Config, "--dashboard-tls-key {} is accessible to its group or others (mode {:o}); chmod 600 it",
            files.key, st.st_mode & 0777);

  ERR_clear_error();
  Owned<X509> cert(PEM_read_X509(open_pem(files.cert, "cert").get(), nullptr, nullptr, nullptr));
  if (!cert)
    fail_as(ErrorKind::Config,
            "--dashboard-tls-cert {}: no PEM certificate in it (a block that begins "
            "'-----BEGIN CERTIFICATE-----')",
            files.cert);
  bool asked = false;
  Owned<EVP_PKEY> key(PEM_read_PrivateKey(open_pem(files.key, "key").get(), nullptr, no_passphrase, &asked));
  ERR_clear_error();
  if (!key && asked)
    fail_as(ErrorKind::Config,
            "--dashboard-tls-key {} is encrypted, and nothing would type its passphrase; write "
            "it decrypted, readable by you only: `openssl pkey -in {} -out KEY && chmod 600 KEY`",
            files.key, files.key);
  if (!key)
    fail_as(ErrorKind::Config,
            "--dashboard-tls-key {}: no PEM private key in it (a block that begins "
            "'-----BEGIN PRIVATE KEY-----')",
            files.key);
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    fail_as(ErrorKind::Config, "--dashboard-tls-key {} is not the private key of the certificate in {}", files.key,
            files.cert);
  }

  // Refused rather than warned about: every browser, curl and Prometheus would refuse such a certificate, so the
  // dashboard would be up and unreadable for the whole job.
  const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
  const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
  if (X509_cmp_current_time(not_before) > 0)
    fail_as(ErrorKind::Config, "--dashboard-tls-cert {} is not valid yet: from {} (this host's clock says {})",
            files.cert, time_text(not_before), [] {
              const std::time_t now = std::time(nullptr);
              std::tm tm{};
              return utc_text(*::gmtime_r(&now, &tm));
            }());
  if (X509_cmp_current_time(not_after) < 0)
    fail_as(ErrorKind::Config, "--dashboard-tls-cert {} expired on {}", files.cert, time_text(not_after));

  TlsCertInfo info;
  info.not_after = time_text(not_after);
  int days = 0, secs = 0;
  if (ASN1_TIME_diff(&days, &secs, nullptr, not_after) == 1) info.days_left = days + secs / 86400.0;
  if (std::tm tm{}; ASN1_TIME_to_tm(not_after, &tm) == 1) info.expires_at = static_cast<double>(::timegm(&tm));
  Owned<BIO> out(BIO_new(BIO_s_mem()));
  X509_NAME_print_ex(out.get(), X509_get_subject_name(cert.get()), 0, XN_FLAG_RFC2253);
  char* text = nullptr;
  const long n = BIO_get_mem_data(out.get(), &text);
  info.subject.assign(text, n > 0 ? size_t(n) : 0);
  return info;
}

}  // namespace mt::launch
