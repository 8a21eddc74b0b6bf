// The check a checkpoint's bytes pass before torch reads them (checkpoint_state.h's Restore*).
//
// A checkpoint is torch's archive format (a zip of records), and torch 1.13 reads it by
// compiling the TorchScript classes in its code/ records and unpickling its pickles. Its
// bytes come from the checkpoint store, where a script job's ranks upload their own, so they
// may be hostile; the compiler crashes (SIGSEGV) on code as small as a misspelt class
// attribute (found by tests/fuzz/checkpoint_state_fuzz.cc). gradhub's archives only ever
// hold what torch::serialize::OutputArchive writes for tensors, strings and numbers, so
// everything else is refused before torch sees it:
//   1. the zip's records are only those such an archive has (data.pkl, constants.pkl, the
//      version, data/<n>, code/__torch__.py, code/__torch__/___torch_mangle_<n>.py and their
//      .debug_pkl), at most kMaxCheckpointRecords of them, none unpacking to more bytes than
//      the whole archive (readers allocate that size before they inflate);
//   2. each code record is class declarations alone, line by line in the exporter's form:
//      `class Module(Module):`, then `__parameters__`/`__buffers__` lists of quoted names,
//      `__annotations__` entries and `name : Type` attributes, whose types are tensors,
//      scalars, strings, modules of the archive, and Optional/List/Tuple/Dict of them; no
//      method, no constant, no other statement;
//   3. the constants pickle is the empty one, and every debug pickle the one such classes get
//      (no source ranges to point at);
//   4. the data pickle (data.pkl) is one torch's pickler could have written, and each storage
//      it asks for fits in the record that holds its bytes (checkpoint_pickle.h), by the
//      sizes the zip's central directory gives (as torch's reader takes them), each name once.
// The version record is torch's zip reader's to check.
// Thread-safe: a pure function of its argument.
#pragma once

#include <cstddef>
#include <string_view>

namespace gradhub::trainer {

inline constexpr size_t kMaxCheckpointRecords = 1 << 20;

// Throws UserError("checkpoint", why) when `bytes` is not an archive gradhub writes.
void CheckCheckpointArchive(std::string_view bytes);

}  // namespace gradhub::trainer
