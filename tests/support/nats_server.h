// A real nats-server on a free loopback port, for C++ tests and benchmarks
// (Python tests use tests/integration/fleet.py). Started in the constructor,
// stopped (SIGTERM, reaped) in the destructor; ok() is false when no
// nats-server binary is installed (scripts/setup.sh installs it).
// Not thread-safe; one owner.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace kvroute::testing {

// A port the OS just gave out on 127.0.0.1 (released before returning).
inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

class NatsServer {
 public:
  NatsServer() : port_(free_port()) {
    const char* bin = nullptr;
    for (const char* c : {"/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"})
      if (::access(c, X_OK) == 0) bin = c;
    if (!bin) return;
    const std::string p = std::to_string(port_);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null_fd = ::open("/dev/null", O_WRONLY);
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
      ::execl(bin, bin, "-a", "127.0.0.1", "-p", p.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~NatsServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  bool ok() const { return pid_ > 0; }
  uint16_t port() const { return port_; }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }

 private:
  uint16_t port_;
  pid_t pid_ = -1;
};

}  // namespace kvroute::testing
