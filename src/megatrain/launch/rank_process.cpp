#include "megatrain/launch/rank_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "megatrain/launch/process_util.h"

namespace mt::launch {

namespace {
constexpr size_t kMaxLine = 65536;
}

OutputStream::OutputStream(int fd, int target, std::string prefix, bool prefixed)
    : fd_(fd), target_(target), prefix_(std::move(prefix)), prefixed_(prefixed) {}

void OutputStream::forward(std::string_view line) {
  if (hook_) hook_(std::string(line));
  if (!prefixed_ || target_ < 0) return;  // already copied byte for byte by feed(), or not forwarded at all
  std::string out = prefix_;
  out.append(line);
  out.push_back('\n');
  write_all(target_, out.data(), out.size());
}

void OutputStream::feed(const char* data, size_t n) {
  if (!prefixed_) {  // --no-prefix: the bytes exactly as the rank wrote them; lines are split only for the hook
    if (target_ >= 0) write_all(target_, data, n);
    if (!hook_) return;
  }
  partial_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
    forward(std::string_view(partial_).substr(start, nl - start));
  partial_.erase(0, start);
  if (partial_.size() > kMaxLine) flush_partial();
}

void OutputStream::flush_partial() {
  if (partial_.empty()) return;
  forward(partial_);
  partial_.clear();
}

void OutputStream::close() {
  flush_partial();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void OutputStream::drain() {
  char buf[65536];
  while (fd_ >= 0) {
    ssize_t k = ::read(fd_, buf, sizeof buf);
    if (k > 0) {
      feed(buf, size_t(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close();  // EOF: every writer (the rank and its children) is gone
  }
}

std::string RankProcess::spawn(const SpawnSpec& spec, std::vector<std::string> env, bool prefixed) {
  // The heartbeat pipe goes to the rank as fd kHeartbeatFd: an inherited descriptor needs no path or port, and its
  // end of file tells the agent that the rank and everything it forked are gone.
  int hb_pipe[2] = {-1, -1};
  if (spec.heartbeat) {
    if (::pipe2(hb_pipe, O_CLOEXEC) != 0)
      return fmt::format("cannot create a pipe for rank {}: {}", global, std::strerror(errno));
    env.push_back(fmt::format("MEGATRAIN_HEARTBEAT_FD={}", kHeartbeatFd));
  }
  // Everything the child needs is built before fork: after fork only async-signal-safe calls are allowed
  // (the store server thread may hold the allocator's lock).
  std::vector<char*> argv, envp;
  for (auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_fail = fmt::format("launch: cannot execute '{}': ", spec.argv[0]);

  int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    std::string why = std::strerror(errno);
    for (int fd : {out_pipe[0], out_pipe[1], hb_pipe[0], hb_pipe[1]})
      if (fd >= 0) ::close(fd);
    return fmt::format("cannot create pipes for rank {}: {}", global, why);
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();
  pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    if (hb_pipe[1] >= 0) {
      if (hb_pipe[1] == kHeartbeatFd)
        ::fcntl(kHeartbeatFd, F_SETFD, 0);  // dup2 onto itself would keep close-on-exec
      else
        ::dup2(hb_pipe[1], kHeartbeatFd);
    }
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);  // an ignored signal would stay ignored across exec
    ::sigaction(SIGTERM, &dfl, nullptr);  // the launcher's way to stop a rank
    ::sigprocmask(SIG_SETMASK, &spec.child_mask, nullptr);
    if (!spec.exec_path.empty())
      ::execve(spec.exec_path.c_str(), argv.data(), envp.data());
    else if (spec.search_path)
      ::execvpe(argv[0], argv.data(), envp.data());
    else
      ::execve(argv[0], argv.data(), envp.data());
    const char* why = ::strerror(errno);
    write_all(2, exec_fail.data(), exec_fail.size());
    write_all(2, why, std::strlen(why));
    write_all(2, "\n", 1);
    ::_exit(127);
  }
  int fork_errno = errno;
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (hb_pipe[1] >= 0) ::close(hb_pipe[1]);
  if (devnull >= 0) ::close(devnull);
  if (child < 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    if (hb_pipe[0] >= 0) ::close(hb_pipe[0]);
    return fmt::format("cannot fork rank {}: {}", global, std::strerror(fork_errno));
  }
  ::setpgid(child, child);  // also here, so a stop right after fork already finds the group
  pid = child;
  running = true;
  const std::string prefix = fmt::format("[rank {}] ", global);
  out = OutputStream(out_pipe[0], 1, prefix, prefixed);
  err = OutputStream(err_pipe[0], 2, prefix, prefixed);
  hb = OutputStream(hb_pipe[0], -1, "", false);
  for (int fd : {out.fd(), err.fd(), hb.fd()})
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  return "";
}

}  // namespace mt::launch
