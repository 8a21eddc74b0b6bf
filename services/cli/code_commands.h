// `gradhub code push|get`, and the code step of `gradhub submit --code DIR`: the commands that
// put a directory into gradhub-checkpoint's CodeService (--checkpoint-server) for script jobs
// (code.proto). Listed in AllCommands (commands.cc).
//
// Pushing a directory:
//   1. pack it as a tar straight into a sha256 (PackDirectoryTo: .gradhubignore, refusing
//      devices, FIFOs and links out of the tree, and the --max-code-bytes cap), naming the
//      entry on a refusal; nothing is written to disk;
//   2. the digest and the size (the archive is measured before it is packed);
//   3. GetCode("sha256:<hex>"): found, so the store has these bytes for this tenant and nothing
//      is sent; NOT_FOUND, so
//   4. UploadCode: a header {size, sha256}, then the tar packed again as it is sent, in 4 MiB
//      messages (the server refuses other bytes than the header's: a directory changed in
//      between is an error, "push again"). UploadCode is idempotent, so a transient failure
//      (grpc_retry.h IsTransient) sends it all again after the shared backoff, for up to
//      kUploadRetryWindow after the first failure;
//   5. one line on stderr: `code: sha256:<hex> 42 entries, 3.1 MiB (uploaded in 0.4 s, ...)`,
//      or `(already uploaded)`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gradhub/v1/jobs.pb.h"
#include "services/cli/invocation.h"

namespace gradhub::cli {

inline constexpr absl::Duration kUploadRetryWindow = absl::Minutes(1);

// The flags of a command that pushes code.
struct CodeFlags {
  std::string dir;                              // --code (submit only)
  int64_t max_code_bytes = int64_t{256} << 20;  // the server's default --max-code-bytes

  // --max-code-bytes, and with `with_dir` --code.
  void Register(Invocation& inv, bool with_dir);
};

// submit's code step. The code comes from --code, else from a `script.code` that is not a
// digest ("sha256:" and 64 lowercase hex digits): a directory, relative to the folder of
// `spec_file` (to the working directory for "-" or /dev/stdin). It is pushed (steps 1-5) and
// its digest written into spec->script.code. --code without a `script:` section is a usage
// error, and --code wins over the spec's `script.code`, with a note on stderr. kOk, or the exit
// code after reporting the error.
int PushSpecCode(Invocation& inv, const CodeFlags& flags, const std::string& spec_file,
                 v1::JobSpec* spec);

// `code push DIR`: steps 1-5; the digest on stdout (the CodeArchive with --output json).
int CodePush(Invocation& inv);

// `code get sha256:<hex>` (or code/<hex>): the archive's size, entries and creation time.
int CodeGet(Invocation& inv);

// Whether `text` is a code digest as ScriptSpec.code takes it: "sha256:<64 lowercase hex>".
bool IsCodeDigest(const std::string& text);

}  // namespace gradhub::cli
