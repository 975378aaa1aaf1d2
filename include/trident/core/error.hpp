// Errors and the checks that raise them.
//
// trident reports failures by exception up to one place (the CLI's main),
// which prints one line and exits: InputError -> exit 2 (bad command line,
// config, checkpoint or mesh request), anything else -> exit 1. Library code
// never calls exit().
#pragma once
#include <stdexcept>
#include <string>

namespace trident {

// Any failure that is not the user's input: exit code 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad input (config key, flag, file, impossible mesh): exit code 2.
// The message is one line naming the file/key/flag and the rule it breaks.
struct InputError : Error {
  using Error::Error;
};

// A blocking wait passed its deadline (runtime.timeout_s). The message names
// the rank, the operation and the peer.
struct TimeoutError : Error {
  using Error::Error;
};

// A failure the ranks of a job agreed on (a collective check that failed, a
// guard's stop): every rank throws it at the same point, and only the rank
// that knows the cause (reporter) prints it, so the job says it once.
struct AgreedError : Error {
  AgreedError(const std::string& msg, bool reporter_) : Error(msg), reporter(reporter_) {}
  bool reporter;
};

// Another rank failed and told this one (comm's failure notice): this rank
// ends quietly with that rank's exit code; the failing rank prints the reason.
struct PeerFailure : Error {
  PeerFailure(int rank_, int code_)
      : Error("rank " + std::to_string(rank_) + " failed"), rank(rank_), code(code_) {}
  int rank, code;
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
// "src/io/run_file.cpp:42": where a check failed, relative to the source tree.
std::string source_place(const char* file, int line);

}  // namespace trident

// Internal invariant check: throws trident::Error with file:line.
#define TRIDENT_CHECK(cond, msg)                                    \
  do {                                                              \
    if (!(cond)) ::trident::throw_error(__FILE__, __LINE__, (msg)); \
  } while (0)
