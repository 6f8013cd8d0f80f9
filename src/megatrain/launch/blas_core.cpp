#include "megatrain/launch/blas_core.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "megatrain/kernels/cpu/blas_probe.h"

extern char** environ;

namespace mt::launch {
namespace {

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string lowercase(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Runs `/proc/self/exe __blas-selftest` with OPENBLAS_CORETYPE=core (the rest of the environment as it is); passes
// when it exits 0 within a minute. `why` gets its output or how it ended.
bool self_test_child(const std::string& core, std::string* why) {
  std::vector<std::string> env_s = {"OPENBLAS_CORETYPE=" + core, "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "OPENBLAS_CORETYPE=", 18) && std::strncmp(*e, "OPENBLAS_NUM_THREADS=", 21) &&
        std::strncmp(*e, "OMP_NUM_THREADS=", 16))
      env_s.push_back(*e);
  std::vector<char*> envp;
  for (std::string& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  char arg0[] = "megatrain", arg1[] = "__blas-selftest";
  char* argv[] = {arg0, arg1, nullptr};
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    *why = std::string("pipe: ") + std::strerror(errno);
    return false;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only: the parent may have threads
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::alarm(60);  // a kernel that hangs fails the test (SIGALRM survives the exec)
    ::execve("/proc/self/exe", argv, envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  if (pid < 0) {
    *why = std::string("fork: ") + std::strerror(errno);
    return false;
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  while (!out.empty() && std::isspace(static_cast<unsigned char>(out.back()))) out.pop_back();
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return true;
  *why = !out.empty()      ? out
         : WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st))
                           : "exit code " + std::to_string(WEXITSTATUS(st));
  return false;
}

}  // namespace

bool blas_core_decided() {
  const char* note = std::getenv(kBlasCoreNoteEnv);
  return note && !blas_core_note_reason(note, env_or_empty("OPENBLAS_CORETYPE")).empty();
}

BlasCoreDecision choose_blas_core() {
  BlasCoreInputs in;
  const char* hook = std::getenv(kBlasTestCorenameEnv);
  in.reported = hook && *hook ? hook : blas_core_name();
  in.cpu = cpu_features();
  if (const char* user = std::getenv("OPENBLAS_CORETYPE"); user && *user) {
    in.user_set = true;
    in.user_coretype = user;
  }
  for (;;) {
    BlasCoreDecision d = decide_blas_core(in);
    if (d.action != BlasCoreAction::Test) {
      if (!d.warning.empty()) std::fprintf(stderr, "megatrain: warning: %s\n", d.warning.c_str());
      return d;
    }
    std::string why;
    const bool ok = self_test_child(d.core, &why);
    if (!ok)
      std::fprintf(stderr, "megatrain: OpenBLAS core %s failed the self-test: %s\n", d.core.c_str(), why.c_str());
    in.tests[d.core] = ok ? BlasSelfTest::Passed : BlasSelfTest::Failed;
  }
}

std::vector<std::string> blas_core_env(const BlasCoreDecision& d) {
  std::vector<std::string> env;
  std::string core = env_or_empty("OPENBLAS_CORETYPE");
  if (d.action == BlasCoreAction::Use) {
    core = d.core;
    env.push_back("OPENBLAS_CORETYPE=" + core);
  }
  env.push_back(std::string(kBlasCoreNoteEnv) + "=" + blas_core_note(core, d.reason));
  return env;
}

int run_blas_self_test() {
  const std::string want = env_or_empty("OPENBLAS_CORETYPE"), got = blas_core_name();
  if (lowercase(want) != lowercase(got)) {
    std::printf("OpenBLAS ran its %s kernels, not %s (not built into this OpenBLAS?)\n", got.c_str(), want.c_str());
    return 1;
  }
  std::string why;
  if (!blas_self_test(&why)) {
    std::printf("%s\n", why.c_str());
    return 1;
  }
  return 0;
}

}  // namespace mt::launch
