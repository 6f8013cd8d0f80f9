#include "megatrain/core/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "megatrain/core/error.h"

namespace mt {

std::string read_text_file(const std::string& path) {
  // A directory opens as an ifstream and reads as empty: it would pass for an empty file (an empty config).
  struct stat st;
  MT_CHECK(::stat(path.c_str(), &st) == 0, "cannot open {}: {}", path, std::strerror(errno));
  MT_CHECK(!S_ISDIR(st.st_mode), "cannot read {}: it is a directory, not a file", path);
  std::ifstream f(path, std::ios::binary);
  MT_CHECK(f.good(), "cannot open {}: {}", path, std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  while (f.read(buf, sizeof buf) || f.gcount() > 0) out.append(buf, static_cast<size_t>(f.gcount()));
  MT_CHECK(!f.bad(), "error reading {}: {}", path, std::strerror(errno));
  return out;
}

std::vector<uint8_t> read_binary_file(const std::string& path) {
  std::string s = read_text_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  MT_CHECK(fd >= 0, "cannot open {} for fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  MT_CHECK(rc == 0, "fsync {} failed: {}", path, std::strerror(err));
}

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MT_CHECK(fd >= 0, "cannot create {}: {}", tmp, std::strerror(errno));
  const char* p = static_cast<const char*>(data);
  size_t left = size;
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail("write to {} failed: {}", tmp, std::strerror(err));
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("flushing {} failed: {}", tmp, std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("rename {} -> {} failed: {}", tmp, path, std::strerror(err));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir);
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace mt
