// The per-job secret that every connection to a tcp:// store must present (store.h). It keeps other local users'
// processes and other hosts from reading or forging rendezvous keys: without it a forged "<group>/arrived/<rank>"
// makes ranks skip the member wait, and a forged Gloo address points a rank at the attacker.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {

std::string random_store_secret() {
  // /dev/urandom rather than std::random_device: the latter may be a deterministic engine on some libraries.
  std::ifstream f("/dev/urandom", std::ios::binary);
  unsigned char bytes[16];
  f.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  MT_CHECK(f.gcount() == sizeof bytes, "cannot read 16 random bytes from /dev/urandom for the store secret");
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

void check_secret(const std::string& secret, const std::string& what, const std::string& origin) {
  // 16 bytes: a secret anyone would choose by hand is too short; `openssl rand -hex 16` gives 32 characters.
  MT_CHECK(secret.size() >= 16 && secret.size() <= 1024,
           "the {} from {} has {} bytes; it must have 16..1024 (e.g. `openssl rand -hex 16`)", what, origin,
           secret.size());
  for (char c : secret)
    MT_CHECK(c > ' ' && c < 127, "the {} from {} contains a space or a non-printable byte ({:#04x})", what, origin,
             static_cast<unsigned char>(c));
}

void check_store_secret(const std::string& secret, const std::string& origin) {
  check_secret(secret, "store secret", origin);
}

std::string store_secret_from_env() {
  const char* v = std::getenv(kStoreSecretEnv);
  if (!v || !*v) return "";
  check_store_secret(v, fmt::format("the environment variable {}", kStoreSecretEnv));
  return v;
}

std::string read_secret_file(const std::string& path, const std::string& what) {
  struct stat st {};
  MT_CHECK(::stat(path.c_str(), &st) == 0, "{} file {}: {}", what, path, std::strerror(errno));
  MT_CHECK(S_ISREG(st.st_mode), "{} file {} is not a regular file", what, path);
  // A secret others can read protects nothing.
  MT_CHECK((st.st_mode & (S_IRWXG | S_IRWXO)) == 0,
           "{} file {} is accessible to its group or others (mode {:o}); chmod 600 it", what, path, st.st_mode & 0777);
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
  check_secret(line, what, "the file " + path);
  return line;
}

std::string read_store_secret_file(const std::string& path) { return read_secret_file(path, "store secret"); }

bool secrets_equal(const std::string& given, const std::string& expected) {
  // Every byte of `expected` is visited whatever `given` holds, so the time tells nothing about a matching prefix.
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

}  // namespace mt
