// Hosts of a test network on this machine, for tests of what crosses a real network: each host is a network
// namespace with one address on one interface, and all of them hang off one bridge in a namespace of its own (the
// switch), so nothing is added to the machine's own network. Cutting a host's switch port drops its packets
// silently, as a pulled cable or a dead switch port does: no reset reaches anyone, and connections just go quiet.
// Needs iproute2's `ip` and the right to make namespaces (root, or CAP_SYS_ADMIN and CAP_NET_ADMIN).
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "files.h"

namespace mt::test {

// Runs a shell command with its output in a private temporary file; its exit code (128 when it did not exit), and
// what it printed in *out.
inline int run_shell(const std::string& cmd, std::string* out = nullptr) {
  char tmpl[] = "/tmp/mt-sh-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd >= 0) ::close(fd);
  const int st = std::system(fmt::format("{} > {} 2>&1 < /dev/null", cmd, tmpl).c_str());
  if (out) *out = slurp(tmpl);
  ::unlink(tmpl);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

class NetHosts {
 public:
  // Where `ip` is; empty when it is not installed.
  static std::string ip_binary() {
    for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
      if (::access(p, X_OK) == 0) return p;
    return "";
  }

  // Hosts 0..n-1 with addresses 10.77.0.1 .. 10.77.0.n/24. The names carry this process's pid, so tests running
  // side by side never meet (and each has the whole 10.77.0.0/24 to itself). On failure, ok() is false and why()
  // says what the machine refused; nothing is left behind.
  explicit NetHosts(int n) : n_(n), ip_(ip_binary()), tag_(fmt::format("mt{}", ::getpid())) {
    if (ip_.empty()) {
      why_ = "iproute2's ip is not installed";
      return;
    }
    made_switch_ = run(fmt::format("netns add {}", sw()));
    if (!made_switch_) {
      why_ = last_error_;
      return;
    }
    bool ok = run(fmt::format("-n {} link add br0 type bridge", sw())) &&
              run(fmt::format("-n {} link set br0 up", sw()));
    for (int i = 0; i < n_ && ok; ++i) {
      ok = run(fmt::format("netns add {}", host(i)));
      if (ok) ++hosts_made_;
      ok = ok && run(fmt::format("link add {} type veth peer name {}", host_if(i), port(i))) &&
           run(fmt::format("link set {} netns {}", host_if(i), host(i))) &&
           run(fmt::format("link set {} netns {}", port(i), sw())) &&
           run(fmt::format("-n {} link set {} master br0", sw(), port(i))) &&
           run(fmt::format("-n {} link set {} up", sw(), port(i))) &&
           run(fmt::format("-n {} link set lo up", host(i))) &&
           run(fmt::format("-n {} addr add {}/24 dev {}", host(i), address(i), host_if(i))) &&
           run(fmt::format("-n {} link set {} up", host(i), host_if(i)));
    }
    ok_ = ok;
    if (!ok_) why_ = last_error_;
  }
  ~NetHosts() {
    for (int i = 0; i < hosts_made_; ++i) {
      for (pid_t p : pids(i)) ::kill(p, SIGKILL);  // a namespace lives on while a process is in it
      run(fmt::format("netns del {}", host(i)));
    }
    if (made_switch_) run(fmt::format("netns del {}", sw()));  // takes the bridge and the veth pairs with it
  }
  NetHosts(const NetHosts&) = delete;
  NetHosts& operator=(const NetHosts&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  std::string address(int i) const { return fmt::format("10.77.0.{}", i + 1); }
  std::string interface(int i) const { return host_if(i); }
  std::string netns(int i) const { return host(i); }  // the namespace's name, for `ip netns exec NAME ...`

  // The command line that runs `argv` on host i: `ip netns exec NAME argv...` (ip execs it: same pid).
  std::vector<std::string> on_host(int i, const std::vector<std::string>& argv) const {
    std::vector<std::string> v = {ip_, "netns", "exec", host(i)};
    v.insert(v.end(), argv.begin(), argv.end());
    return v;
  }
  // Host i's switch port down (a cut cable) or up again. Throws when ip fails.
  void cut(int i) { must(fmt::format("-n {} link set {} down", sw(), port(i))); }
  void restore(int i) { must(fmt::format("-n {} link set {} up", sw(), port(i))); }
  // The processes in host i's namespace.
  std::vector<pid_t> pids(int i) const {
    std::vector<pid_t> v;
    if (FILE* p = ::popen(fmt::format("{} netns pids {} 2>/dev/null", ip_, host(i)).c_str(), "r")) {
      for (int pid; std::fscanf(p, "%d", &pid) == 1;) v.push_back(pid);
      ::pclose(p);
    }
    return v;
  }

 private:
  std::string sw() const { return tag_ + "sw"; }
  std::string host(int i) const { return fmt::format("{}h{}", tag_, i); }
  std::string host_if(int i) const { return fmt::format("{}h{}", tag_, i); }  // (interface names: <= 15 chars)
  std::string port(int i) const { return fmt::format("{}s{}", tag_, i); }

  bool run(const std::string& args) const {
    std::string msg;
    if (run_shell(fmt::format("{} {}", ip_, args), &msg) == 0) return true;
    last_error_ = fmt::format("`ip {}` failed: {}", args, msg.empty() ? "(no message)" : msg);
    return false;
  }
  void must(const std::string& args) {
    if (!run(args)) throw std::runtime_error(last_error_);
  }

  int n_;
  std::string ip_, tag_;
  std::string why_;
  mutable std::string last_error_;
  bool ok_ = false, made_switch_ = false;
  int hosts_made_ = 0;
};

}  // namespace mt::test
