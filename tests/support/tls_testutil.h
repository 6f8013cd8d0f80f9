// Certificates for the TLS tests, made with OpenSSL's libcrypto in the test itself: self-signed, for 127.0.0.1 (its
// CN and subjectAltName, which clients check), with any validity window, so expired and not-yet-valid ones can be
// made too (the openssl command of Debian 12 takes only a positive number of days).
#pragma once
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace mt::test {

struct TestCert {
  std::string cert, key;  // PEM files
};

// dir/NAME.crt and dir/NAME.key (mode 600): a P-256 key (or RSA of rsa_bits) and a certificate valid from
// now + from_s to now + to_s seconds. With a passphrase the key is written encrypted (AES-256-CBC).
inline TestCert make_test_cert(const std::filesystem::path& dir, const std::string& name, long from_s = -60,
                               long to_s = 2 * 86400, const std::string& passphrase = "", unsigned rsa_bits = 0) {
  static long serial = 1;
  std::filesystem::create_directories(dir);
  TestCert out{(dir / (name + ".crt")).string(), (dir / (name + ".key")).string()};
  EVP_PKEY* key = rsa_bits ? EVP_RSA_gen(rsa_bits) : EVP_EC_gen("P-256");
  X509* x = X509_new();
  if (!key || !x) throw std::runtime_error("make_test_cert: OpenSSL could not make a key");
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), from_s);
  X509_gmtime_adj(X509_getm_notAfter(x), to_s);
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1,
                             0);
  X509_set_issuer_name(x, subject);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (auto [nid, value] :
       {std::pair{NID_subject_alt_name, "IP:127.0.0.1"}, std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(x, key, EVP_sha256());
  FILE* c = std::fopen(out.cert.c_str(), "w");
  PEM_write_X509(c, x);
  std::fclose(c);
  FILE* k = std::fopen(out.key.c_str(), "w");
  ::chmod(out.key.c_str(), 0600);
  if (passphrase.empty()) {
    PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
  } else {
    PEM_write_PrivateKey(k, key, EVP_aes_256_cbc(), nullptr, 0, nullptr, const_cast<char*>(passphrase.c_str()));
  }
  std::fclose(k);
  X509_free(x);
  EVP_PKEY_free(key);
  return out;
}

}  // namespace mt::test
