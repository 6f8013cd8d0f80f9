// Fuzzes SafetensorsFile::open (the reader of our checkpoint files and of HF weights): the input is the whole file.
// What open() accepts must then be served safely: every tensor inside the data region, the tensors tiling it
// exactly (the documented format), each one's byte count matching its dtype and shape, and every float tensor
// convertible with to_f32.
#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "megatrain/ckpt/safetensors.h"
#include "megatrain/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mt::fuzz::write_scratch("input.safetensors", data, size);
  FUZZ_ACCEPT_MT_ERRORS({
    mt::SafetensorsFile f = mt::SafetensorsFile::open(path);
    FUZZ_CHECK(f.file_size() == size, fmt::format("file_size {} of a {}-byte file", f.file_size(), size));
    uint64_t pos = f.header_size();
    for (const mt::TensorData* t : f.in_file_order()) {
      FUZZ_CHECK(t->offset == pos, fmt::format("tensor '{}' at {}, expected {}", t->name, t->offset, pos));
      pos += t->nbytes;
      FUZZ_CHECK(pos <= size, fmt::format("tensor '{}' ends at {}, past the file's {} bytes", t->name, pos, size));
      FUZZ_CHECK(t->data == f.bytes() + t->offset, "tensor data pointer is not at its offset");
      const int64_t n = t->numel();  // must be computable without overflow for any accepted shape
      if (!t->supported) continue;
      FUZZ_CHECK(static_cast<uint64_t>(n) * mt::dtype_size(t->dtype) == t->nbytes,
                 fmt::format("tensor '{}' {} {}: {} bytes", t->name, t->dtype_str, t->shape_str(), t->nbytes));
      FUZZ_CHECK(&f.get(t->name) == t, "get() returns another tensor");
      if (t->dtype_str == "F32" || t->dtype_str == "F16" || t->dtype_str == "BF16") {
        std::vector<float> out(static_cast<size_t>(n) + 1);  // + 1: never a null destination
        mt::to_f32(*t, out.data());
      }
    }
    FUZZ_CHECK(pos == size, fmt::format("the tensors cover up to byte {} of {}", pos, size));
  });
  return 0;
}
