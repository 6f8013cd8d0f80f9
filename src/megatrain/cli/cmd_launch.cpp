// megatrain launch: spawns this node's ranks with torchrun's environment plus MEGATRAIN_STORE and
// MEGATRAIN_STORE_SECRET (and MEGATRAIN_IFACE with --iface), copies their
// output line by line with a "[rank R] " prefix, and supervises them: the first rank to fail (or a SIGINT /
// SIGTERM / SIGHUP to the launcher) stops all of them, SIGKILL follows after a grace period.
//
// No orphans: every rank leads its own process group (so a stop reaches the rank's own children too) and dies
// with the launcher (PR_SET_PDEATHSIG); the launcher is a child subreaper, so processes the ranks leave behind
// become its children, and it kills and reaps whatever remains before it exits.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "megatrain/cli/commands.h"
#include "megatrain/core/clock.h"
#include "megatrain/core/error.h"
#include "megatrain/comm/local_address.h"
#include "megatrain/comm/store.h"

extern char** environ;

namespace mt::cli {
namespace {

struct Options {
  int nproc = 0, nnodes = 1, node_rank = 0;
  std::string master;  // ADDR[:PORT]
  std::string store;   // store URL; empty: node 0 serves a tcp store
  std::string iface;   // MEGATRAIN_IFACE for the ranks (an interface name or address); empty: their own choice
  std::string secret_file;  // the store secret (else MEGATRAIN_STORE_SECRET, else a fresh one on one node)
  bool exec = false, no_prefix = false;
  double grace = 5.0;
  std::vector<std::string> args;
};

struct Stream {
  int fd = -1;     // read end of the rank's pipe; -1 once closed
  int target = 1;  // the launcher's fd it is copied to
  std::string partial;
};

struct RankProc {
  int global = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
};

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;  // the reader went away (SIGPIPE is ignored): drop output rather than die
    p += k, n -= size_t(k);
  }
}
void say(const std::string& msg) {
  std::string line = "launch: " + msg + "\n";
  write_all(2, line.data(), line.size());
}

std::string describe_status(int st) {
  if (WIFEXITED(st)) return fmt::format("exited with code {}", WEXITSTATUS(st));
  int sig = WTERMSIG(st);
  return fmt::format("was killed by signal {} ({})", sig, ::strsignal(sig));
}
int exit_code_of(int st) { return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); }

std::string plural(int n, const char* what) { return fmt::format("{} {}{}", n, what, n == 1 ? "" : "s"); }

// The processes whose parent is this one (after PR_SET_CHILD_SUBREAPER that includes orphaned descendants).
std::vector<pid_t> my_children() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(fmt::format("/proc/self/task/{}/children", e->d_name));
    for (pid_t p; f >> p;) out.push_back(p);
  }
  ::closedir(d);
  return out;
}

class Launcher {
 public:
  explicit Launcher(Options o) : opt_(std::move(o)) {}

  int run() {
    setup_signals();
    std::string store_url = start_store();
    std::vector<std::string> base_env = inherited_env();
    argv_ = opt_.args;
    if (!opt_.exec) {  // ARGS are a subcommand of this very binary
      char buf[PATH_MAX];
      ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
      MT_CHECK(n > 0, "cannot resolve /proc/self/exe: {}", std::strerror(errno));
      argv_.insert(argv_.begin(), std::string(buf, size_t(n)));
    }

    int first = opt_.node_rank * opt_.nproc, world = opt_.nnodes * opt_.nproc;
    say(fmt::format("starting {} (global {}..{} of {}), store {}", plural(opt_.nproc, "rank"), first,
                    first + opt_.nproc - 1, world, store_url));
    ranks_.resize(size_t(opt_.nproc));
    for (int i = 0; i < opt_.nproc && !stopping_; ++i) {
      std::vector<std::string> env = base_env;
      for (auto [k, v] : {std::pair<const char*, std::string>{"RANK", std::to_string(first + i)},
                          {"WORLD_SIZE", std::to_string(world)},
                          {"LOCAL_RANK", std::to_string(i)},
                          {"LOCAL_WORLD_SIZE", std::to_string(opt_.nproc)},
                          {"MASTER_ADDR", master_addr_},
                          {"MASTER_PORT", std::to_string(master_port_)},
                          {"MEGATRAIN_STORE", store_url},
                          {kStoreSecretEnv, secret_}})
        env.push_back(fmt::format("{}={}", k, v));
      if (!opt_.iface.empty()) env.push_back(fmt::format("{}={}", kIfaceEnv, opt_.iface));
      ranks_[size_t(i)].global = first + i;
      spawn(ranks_[size_t(i)], env);
    }
    supervise();
    server_.reset();
    return exit_code_;
  }

 private:
  // Signals arrive through a signalfd, so they are blocked before any thread (the store server) exists and every
  // thread inherits the mask. Children get the original mask back before exec. SIGINT / SIGHUP that the caller
  // ignores (nohup, a background job of a script) stay ignored, for the launcher and its ranks alike.
  void setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction sa {};
      ::sigaction(s, nullptr, &sa);
      if (sa.sa_handler != SIG_IGN || s == SIGTERM || s == SIGCHLD) sigaddset(&set, s);
    }
    MT_CHECK(::sigprocmask(SIG_BLOCK, &set, &old_mask_) == 0, "sigprocmask: {}", std::strerror(errno));
    sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    MT_CHECK(sigfd_ >= 0, "signalfd: {}", std::strerror(errno));
    ::signal(SIGPIPE, SIG_IGN);
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  }

  std::string start_store() {
    std::string addr = opt_.master;
    int port = -1;
    if (size_t colon = addr.rfind(':'); colon != std::string::npos && addr.find(']', colon) == std::string::npos) {
      std::string p = addr.substr(colon + 1);
      addr = addr.substr(0, colon);
      char* end = nullptr;
      long v = std::strtol(p.c_str(), &end, 10);
      MT_CHECK(!p.empty() && *end == '\0' && v >= 1 && v <= 65535, "--master '{}': port '{}' is not in 1..65535",
               opt_.master, p);
      port = int(v);
    }
    if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') addr = addr.substr(1, addr.size() - 2);
    master_addr_ = addr.empty() ? "127.0.0.1" : addr;
    std::string host = master_addr_.find(':') != std::string::npos ? "[" + master_addr_ + "]" : master_addr_;

    secret_ = choose_secret();
    if (!opt_.store.empty()) {
      master_port_ = port > 0 ? port : 29500;
      return opt_.store;
    }
    if (opt_.node_rank == 0) {
      // Listen on the master address only: loopback by default on one node, on several the address the other
      // nodes were told (never every interface: the store must not be reachable from where the job is not).
      std::string bind = master_addr_;
      if (opt_.nnodes > 1) {
        bind = resolve_numeric(master_addr_, "--master");
        MT_CHECK(!is_loopback_address(bind),
                 "--master '{}' is the loopback address {}, which the other {} cannot reach; give node 0's address on "
                 "the network they share (this host has: {})",
                 opt_.master, bind, plural(opt_.nnodes - 1, "node"), list_local_addresses());
      }
      TcpStoreLimits limits;
      // Each rank holds a few connections (one per thread blocked in the store at a time); 8 per rank is ample.
      limits.max_connections = std::max(1024, 8 * opt_.nnodes * opt_.nproc);
      server_ = std::make_unique<TcpStoreServer>(bind, port > 0 ? port : 0, secret_, limits);
      master_port_ = server_->port();
      if (opt_.nnodes > 1) say(fmt::format("the store listens on {}:{}", bind, master_port_));
    } else {
      master_port_ = port;
    }
    return fmt::format("tcp://{}:{}", host, master_port_);
  }

  // The tcp store's secret: the user's (a file, or MEGATRAIN_STORE_SECRET), which every node of a multi-node job
  // must share; on one node a fresh random one when the user gave none.
  std::string choose_secret() {
    std::string s = opt_.secret_file.empty() ? store_secret_from_env() : read_store_secret_file(opt_.secret_file);
    if (!s.empty()) return s;
    bool tcp = opt_.store.empty() || opt_.store.rfind("tcp://", 0) == 0;
    MT_CHECK(opt_.nnodes == 1 || !tcp,
             "--nnodes {} with a tcp store needs the store secret every node shares: set {} to the same value on "
             "every node (e.g. `export {}=$(openssl rand -hex 16)` in the job script, before the launchers start), "
             "or give --secret-file FILE (mode 600, on a file system every node reads)",
             opt_.nnodes, kStoreSecretEnv, kStoreSecretEnv);
    return random_store_secret();
  }

  std::vector<std::string> inherited_env() {
    std::set<std::string> ours = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                  "MASTER_ADDR", "MASTER_PORT", "MEGATRAIN_STORE", kStoreSecretEnv};
    if (!opt_.iface.empty()) ours.insert(kIfaceEnv);
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (!ours.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    return env;
  }

  void spawn(RankProc& r, const std::vector<std::string>& env) {
    // Everything the child needs is built before fork: after fork only async-signal-safe calls are allowed
    // (the store server thread may hold the allocator's lock).
    std::vector<char*> argv, envp;
    for (auto& a : argv_) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    std::string exec_fail = fmt::format("launch: cannot execute '{}': ", argv_[0]);

    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      std::string why = std::strerror(errno);
      for (int fd : {out[0], out[1]})
        if (fd >= 0) ::close(fd);
      abort_start(fmt::format("cannot create pipes for rank {}: {}", r.global, why));
      return;
    }
    int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);  // the launcher died before prctl took effect
      if (devnull >= 0) ::dup2(devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(SIGPIPE, &dfl, nullptr);  // an ignored signal would stay ignored across exec
      ::sigaction(SIGTERM, &dfl, nullptr);  // the launcher's way to stop a rank
      ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      if (opt_.exec)
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
    ::close(out[1]);
    ::close(err[1]);
    if (devnull >= 0) ::close(devnull);
    if (pid < 0) {
      ::close(out[0]);
      ::close(err[0]);
      abort_start(fmt::format("cannot fork rank {}: {}", r.global, std::strerror(fork_errno)));
      return;
    }
    ::setpgid(pid, pid);  // also here, so a stop right after fork already finds the group
    r.pid = pid;
    r.running = true;
    r.out = Stream{out[0], 1, {}};
    r.err = Stream{err[0], 2, {}};
    for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }

  void abort_start(const std::string& why) {
    say(why + "; stopping the ranks already started");
    if (exit_code_ == 0) exit_code_ = 1;
    begin_stop(SIGTERM);
  }

  int running_count() const {
    return int(std::count_if(ranks_.begin(), ranks_.end(), [](const RankProc& r) { return r.running; }));
  }

  // Signals every rank's process group, including groups whose leader already exited (its children may live on).
  void signal_all(int sig) {
    for (auto& r : ranks_)
      if (r.pid > 0) ::killpg(r.pid, sig);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    kill_at_ = now_seconds() + opt_.grace;
    signal_all(sig);
  }

  void on_rank_exit(RankProc& r, int st) {
    r.running = false;
    bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!failed || stopping_) return;  // exits caused by a stop are expected, not news
    say(fmt::format("rank {} (pid {}) {}; stopping the other {}", r.global, r.pid, describe_status(st),
                    plural(running_count(), "rank")));
    exit_code_ = std::max(1, exit_code_of(st));
    begin_stop(SIGTERM);
  }

  void reap() {
    for (;;) {
      int st = 0;
      pid_t pid = ::waitpid(-1, &st, WNOHANG);
      if (pid <= 0) return;
      for (auto& r : ranks_)
        if (r.pid == pid && r.running) on_rank_exit(r, st);
      // Any other pid is an orphaned descendant handed to us as subreaper: reaping it is all it needs.
    }
  }

  void on_signals() {
    signalfd_siginfo si;
    while (::read(sigfd_, &si, sizeof si) == ssize_t(sizeof si)) {
      int sig = int(si.ssi_signo);
      if (sig == SIGCHLD) {
        reap();
      } else if (!stopping_) {
        const char* name = ::sigabbrev_np(sig);
        say(fmt::format("received SIG{}; stopping {}", name ? name : std::to_string(sig),
                        plural(running_count(), "rank")));
        exit_code_ = 128 + sig;
        begin_stop(sig);  // forwarded as is: ranks may treat SIGINT and SIGTERM differently
      } else if (!killed_) {
        say("signalled again; killing the ranks now");
        kill_at_ = now_seconds();
      }
    }
  }

  void emit(RankProc& r, Stream& s, const char* data, size_t n) {
    if (opt_.no_prefix) return write_all(s.target, data, n);
    s.partial.append(data, n);
    std::string prefix = fmt::format("[rank {}] ", r.global);
    size_t start = 0;
    for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = prefix;
      line.append(s.partial, start, nl + 1 - start);
      write_all(s.target, line.data(), line.size());  // one write per line: ranks never interleave mid-line
    }
    s.partial.erase(0, start);
    if (s.partial.size() > 65536) flush_partial(r, s);
  }
  void flush_partial(RankProc& r, Stream& s) {
    if (s.partial.empty()) return;
    std::string line = fmt::format("[rank {}] {}\n", r.global, s.partial);
    write_all(s.target, line.data(), line.size());
    s.partial.clear();
  }
  void close_stream(RankProc& r, Stream& s) {
    flush_partial(r, s);
    ::close(s.fd);
    s.fd = -1;
  }
  void drain(RankProc& r, Stream& s) {
    char buf[65536];
    for (;;) {
      ssize_t k = ::read(s.fd, buf, sizeof buf);
      if (k > 0) {
        emit(r, s, buf, size_t(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return close_stream(r, s);  // EOF: every writer (the rank and its children) is gone
    }
  }

  void supervise() {
    double drain_until = 0;  // once all ranks are gone: stop waiting for pipes held open by escaped processes
    bool cleaned = false;
    std::vector<pollfd> fds;
    std::vector<std::pair<RankProc*, Stream*>> owners;
    for (;;) {
      double now = now_seconds();
      if (stopping_ && !killed_ && running_count() > 0 && now >= kill_at_) {
        for (auto& r : ranks_)
          if (r.running) say(fmt::format("rank {} (pid {}) still running after the grace period; killing it", r.global, r.pid));
        signal_all(SIGKILL);
        killed_ = true;
      }
      if (running_count() == 0 && !cleaned) {
        // Whatever the ranks left behind (it may hold their pipes open): first their groups, then escapees.
        signal_all(SIGKILL);
        kill_orphans();
        cleaned = true;
        drain_until = now + 2.0;
      }

      fds.clear();
      owners.clear();
      fds.push_back({sigfd_, POLLIN, 0});
      for (auto& r : ranks_)
        for (Stream* s : {&r.out, &r.err})
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            owners.push_back({&r, s});
          }
      if (cleaned && (fds.size() == 1 || now >= drain_until)) break;

      double until = cleaned ? drain_until : (stopping_ && !killed_) ? kill_at_ : now + 3600;
      int ms = int(std::clamp((until - now) * 1000.0 + 1, 0.0, 3.6e6));
      int n = ::poll(fds.data(), fds.size(), ms);
      if (n < 0 && errno != EINTR) {
        say(fmt::format("poll: {}", std::strerror(errno)));
        break;
      }
      if (n <= 0) continue;
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) drain(*owners[i - 1].first, *owners[i - 1].second);
      if (fds[0].revents) on_signals();
    }
    for (auto& r : ranks_)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) close_stream(r, *s);
    kill_orphans();
  }

  // Processes that escaped the ranks' groups (setsid daemons) were reparented to us: kill and reap them, and
  // repeat for their own children, which become ours in turn.
  void kill_orphans() {
    double deadline = now_seconds() + 2.0;
    for (;;) {
      reap();
      std::vector<pid_t> kids = my_children();
      if (kids.empty() || now_seconds() > deadline) return;
      for (pid_t p : kids) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  Options opt_;
  std::vector<std::string> argv_;  // of every rank
  std::unique_ptr<TcpStoreServer> server_;
  std::string master_addr_;
  int master_port_ = 0;
  std::string secret_;
  std::vector<RankProc> ranks_;
  int sigfd_ = -1;
  sigset_t old_mask_{};
  bool stopping_ = false, killed_ = false;
  double kill_at_ = 0;
  int exit_code_ = 0;
};

}  // namespace

int cmd_launch(int argc, char** argv) {
  CLI::App app{"Spawn this node's ranks with torchrun-style environment variables (RANK, WORLD_SIZE, LOCAL_RANK,\n"
               "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus MEGATRAIN_STORE, and supervise them.\n"
               "  megatrain launch --nproc 4 -- train --config configs/tiny.toml\n"
               "  megatrain launch --nproc 8 --nnodes 2 --node-rank 1 --master node01:29500 -- train ...\n"
               "  megatrain launch --nproc 2 --exec -- /bin/sh -c 'echo $RANK'\n"
               "Node 0 serves a tcp:// store on the master address and port (a free port on one node) unless --store\n"
               "is given. Every connection to it must present the job's secret, which the ranks get in\n"
               "MEGATRAIN_STORE_SECRET: a fresh random one on one node; on several nodes set MEGATRAIN_STORE_SECRET\n"
               "to the same value on every node (or give --secret-file). Multi-node ranks communicate on the\n"
               "interface that routes to the master, or on --iface.\n"
               "If a rank fails, or the launcher gets SIGINT/SIGTERM, every rank is stopped (SIGTERM, then SIGKILL\n"
               "after --grace seconds) and the launcher exits non-zero.",
               "megatrain launch"};
  Options o;
  app.add_option("--nproc,-n", o.nproc, "ranks to start on this node")->required()->check(CLI::Range(1, 4096));
  app.add_option("--nnodes", o.nnodes, "nodes in the job (default 1)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--node-rank", o.node_rank, "this node's index, 0..nnodes-1 (default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master", o.master,
                 "ADDR[:PORT] of node 0 (its store; default 127.0.0.1 and a free port on one node, port 29500 on several)");
  app.add_option("--store", o.store, "use this store URL (file://, tcp://, redis://) instead of serving one");
  app.add_option("--iface", o.iface,
                 "interface (e.g. eth1) or local address the ranks communicate on (sets MEGATRAIN_IFACE; default: "
                 "loopback on one node, the interface that routes to the master on several)");
  app.add_option("--secret-file", o.secret_file,
                 "file whose first line is the store secret (mode 600; default: MEGATRAIN_STORE_SECRET, else a "
                 "random one on one node)");
  app.add_flag("--exec", o.exec, "ARGS[0] is a program to run (default: ARGS are a megatrain subcommand)");
  app.add_option("--grace", o.grace, "seconds between SIGTERM and SIGKILL when stopping ranks (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-prefix", o.no_prefix, "copy the ranks' output without the '[rank R] ' prefix");
  app.add_option("args", o.args, "after --: the megatrain subcommand and its options (or, with --exec, a program)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_CHECK(!o.args.empty(), "nothing to launch: give the command after '--', e.g. megatrain launch --nproc 2 -- train");
  MT_CHECK(o.node_rank < o.nnodes, "--node-rank {} must be below --nnodes {}", o.node_rank, o.nnodes);
  if (o.nnodes > 1 && o.store.empty()) {
    MT_CHECK(!o.master.empty(), "--nnodes {} needs --master ADDR:PORT (node 0's address) or --store URL", o.nnodes);
    if (o.master.rfind(':') == std::string::npos || o.master.back() == ']') o.master += ":29500";
  }
  if (!o.iface.empty()) local_address_of(o.iface, "--iface");  // a typo fails here, not in every rank
  return Launcher(std::move(o)).run();
}

}  // namespace mt::cli
