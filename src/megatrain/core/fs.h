// Small file helpers with error messages that name the file.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mt {

std::string read_text_file(const std::string& path);  // throws "cannot open <path>: <why>" (a directory too)
std::vector<uint8_t> read_binary_file(const std::string& path);
// Writes to <path>.tmp.<pid>, fsyncs, renames over <path>, fsyncs the directory: readers see old or new, never half.
void write_file_atomic(const std::string& path, const void* data, size_t size);
inline void write_file_atomic(const std::string& path, const std::string& s) {
  write_file_atomic(path, s.data(), s.size());
}
void fsync_path(const std::string& path);  // fsync a file or directory
bool file_exists(const std::string& path);

}  // namespace mt
