// The fuzz targets without libFuzzer (GCC builds, where it is absent): feeds every file named
// on the command line, or found directly inside a directory named there, to
// LLVMFuzzerTestOneInput once, in sorted order, so the corpus kept in the tree runs as a ctest.
// Arguments starting with "-" are skipped (libFuzzer's flags), so one command line serves both
// builds. Exit status 0 when every input ran; a crash in the target ends the process (the
// sanitizers or the ctest report it), after the name of the input was printed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

// The files `arg` names: itself, or a directory's regular files, sorted.
std::vector<fs::path> InputsOf(const fs::path& arg) {
  if (!fs::is_directory(arg)) return {arg};
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(arg)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

bool RunOne(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int inputs = 0;
  bool ok = true;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    for (const fs::path& path : InputsOf(argv[i])) {
      ok = RunOne(path) && ok;
      ++inputs;
    }
  }
  std::fprintf(stderr, "replay: %d inputs\n", inputs);
  return ok && inputs > 0 ? 0 : 1;
}
