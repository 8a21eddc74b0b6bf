// The reading of a checkpoint archive's data pickle (data.pkl) that CheckCheckpointArchive
// (checkpoint_archive.h) does before torch runs it. torch 1.13's unpickler trusts what the
// pickle says: a storage of N elements is made N elements long whatever the size of the record
// that holds its bytes (a tensor then reads and writes the heap past them), a memo index of
// 2^32 grows its memo table to 2^32 entries, a string length is allocated before it is read.
// So the pickle is first read here without being run:
//   1. it is a program of the opcodes torch's pickler writes (protocol 2), each operand inside
//      the pickle, ending in STOP with one value left; no opcode takes from below a MARK or
//      from an empty stack;
//   2. memo indices are given in order (each PUT at most one past the last) and every GET
//      names one already given;
//   3. GLOBALs name torch's and the archive's own classes and functions only;
//   4. every persistent id (BINPERSID) is a literal ('storage', torch.<T>Storage, key,
//      location, numel): the storage it asks for is returned, for the caller to compare with
//      the record that backs it.
// Thread-safe: a pure function of its argument.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradhub::trainer {

// A storage the pickle asks torch to make: the bytes of record data/<key> it takes.
struct StorageClaim {
  std::string key;
  uint64_t bytes = 0;
};

// Throws UserError("checkpoint", why) unless steps 1-4 hold.
std::vector<StorageClaim> ScanDataPickle(std::string_view pickle);

}  // namespace gradhub::trainer
