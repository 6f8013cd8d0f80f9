// Small POSIX helpers the launcher's pieces share: writing whole buffers, describing a wait status, and the
// processes reparented to a child subreaper.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace mt::launch {

// Writes all n bytes, retrying on EINTR; gives up silently when the reader went away (SIGPIPE is ignored by the
// launcher: output to a closed terminal must not kill the supervisor of a running job).
void write_all(int fd, const char* p, size_t n);

// "launch: <msg>" on stderr, as one write.
void say(const std::string& msg);

// "exited with code 3" / "was killed by signal 9 (Killed)".
std::string describe_status(int wait_status);
// The shell's convention: the exit code, or 128 + the signal.
int exit_code_of(int wait_status);

// "1 rank" / "3 ranks".
std::string plural(int n, const char* what);

// The processes whose parent is this one (after PR_SET_CHILD_SUBREAPER that includes orphaned descendants).
std::vector<pid_t> my_children();

}  // namespace mt::launch
