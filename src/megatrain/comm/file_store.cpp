// file://DIR: one file per key in a shared directory. Writers create a temporary file and rename it over the key's
// file, so a reader sees the old value, the new value or no file, never a partial one. add() serialises its
// read-modify-write with flock on a per-key lock file, which is safe across processes and threads (each call opens
// its own file description). No fsync: a rendezvous store lives as long as the job, on one host's page cache.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "megatrain/core/error.h"
#include "megatrain/comm/store.h"

namespace mt {
namespace {

// Keys may hold '/', '[', ',' ...; map them to one flat, portable file name. Names starting with '.' are ours
// (temporary and lock files), so a key's leading '.' is escaped too.
std::string encode_key(const std::string& key) {
  MT_CHECK(!key.empty(), "file store: empty key");
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < key.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    bool plain = std::isalnum(c) || c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  MT_CHECK(out.size() <= 200, "file store: key '{}' is too long ({} bytes encoded, at most 200)", key, out.size());
  return out;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class FileStore : public Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    MT_CHECK(!ec && std::filesystem::is_directory(dir_), "file store: cannot create directory {}: {}", dir_,
             ec ? ec.message() : "not a directory");
  }

  void set(const std::string& key, const std::string& value) override { write_value(path_of(key), key, value); }

  std::string get(const std::string& key, Millis timeout) override {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout;
    const std::string path = path_of(key);
    auto backoff = std::chrono::microseconds(500);
    std::string value;
    for (;;) {
      if (read_value(path, key, value)) return value;
      auto now = Clock::now();
      MT_CHECK(now < deadline, "file store {}: key '{}' not set within {:g} s", dir_, key, timeout.count() / 1000.0);
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::microseconds(20000));
    }
  }

  bool check(const std::string& key) override {
    struct stat st;
    return ::stat(path_of(key).c_str(), &st) == 0;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const std::string path = path_of(key);
    const std::string lock_path = dir_ + "/.lock-" + encode_key(key);
    Fd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    MT_CHECK(lock.get() >= 0, "file store: cannot open lock file {}: {}", lock_path, std::strerror(errno));
    while (::flock(lock.get(), LOCK_EX) != 0) {
      MT_CHECK(errno == EINTR, "file store: cannot lock {}: {}", lock_path, std::strerror(errno));
    }
    // The lock is released when `lock` closes, also when a check below throws.
    std::string cur;
    int64_t value = 0;
    if (read_value(path, key, cur)) {
      auto [end, ec] = std::from_chars(cur.data(), cur.data() + cur.size(), value);
      MT_CHECK(ec == std::errc() && end == cur.data() + cur.size(),
               "file store {}: add to key '{}', which holds '{}', not an integer", dir_, key, cur);
    }
    value += delta;
    write_value(path, key, std::to_string(value));
    return value;
  }

  void remove(const std::string& key) override {
    const std::string path = path_of(key);
    MT_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT, "file store: cannot remove {}: {}", path,
             std::strerror(errno));
  }

 private:
  std::string path_of(const std::string& key) const { return dir_ + "/" + encode_key(key); }

  // False when the key's file does not exist.
  bool read_value(const std::string& path, const std::string& key, std::string& out) const {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      MT_CHECK(errno == ENOENT, "file store: cannot read key '{}' ({}): {}", key, path, std::strerror(errno));
      return false;
    }
    out.clear();
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      MT_CHECK(n >= 0, "file store: cannot read key '{}' ({}): {}", key, path, std::strerror(errno));
      if (n == 0) return true;
      out.append(buf, static_cast<size_t>(n));
    }
  }

  void write_value(const std::string& path, const std::string& key, const std::string& value) const {
    static std::atomic<uint64_t> counter{0};
    const std::string tmp = fmt::format("{}/.tmp-{}-{}", dir_, ::getpid(), counter.fetch_add(1));
    {
      Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      MT_CHECK(fd.get() >= 0, "file store: cannot create {} for key '{}': {}", tmp, key, std::strerror(errno));
      const char* p = value.data();
      size_t left = value.size();
      while (left > 0) {
        ssize_t w = ::write(fd.get(), p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          int err = errno;
          ::unlink(tmp.c_str());
          fail("file store: writing key '{}' to {} failed: {}", key, tmp, std::strerror(err));
        }
        p += w;
        left -= static_cast<size_t>(w);
      }
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      int err = errno;
      ::unlink(tmp.c_str());
      fail("file store: cannot publish key '{}' ({} -> {}): {}", key, tmp, path, std::strerror(err));
    }
  }

  std::string dir_;
};

}  // namespace

std::unique_ptr<Store> make_file_store(const std::string& dir) {
  MT_CHECK(!dir.empty(), "file store: empty directory");
  return std::make_unique<FileStore>(dir);
}

}  // namespace mt
