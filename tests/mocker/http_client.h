// A minimal blocking HTTP/1.1 client for the mocker tests (POSIX sockets,
// loopback only): Content-Length and chunked bodies, SSE `data:` payloads,
// keep-alive. Test code only; not thread-safe (one connection per object).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvroute::testing {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // HTTP chunks, in order (chunked bodies)
  std::vector<std::string> sse;                // SSE `data: ` payloads, in order

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

class HttpConnection {
 public:
  explicit HttpConnection(uint16_t port, int recv_timeout_ms = 10000) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) throw std::runtime_error("socket");
    timeval tv{recv_timeout_ms / 1000, (recv_timeout_ms % 1000) * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) throw std::runtime_error("connect");
  }
  ~HttpConnection() { close(); }
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send_request(const std::string& method, const std::string& path, const std::string& body = "") {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    if (!body.empty() || method == "POST")
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    req += "\r\n" + body;
    size_t off = 0;
    while (off < req.size()) {
      ssize_t n = ::send(fd_, req.data() + off, req.size() - off, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send");
      off += static_cast<size_t>(n);
    }
  }

  // Reads one response. Throws on timeout or a closed connection.
  HttpResponse read_response() {
    HttpResponse r;
    const std::string status_line = line();
    if (status_line.size() < 12) throw std::runtime_error("bad status line: " + status_line);
    r.status = std::stoi(status_line.substr(9, 3));
    for (std::string l; !(l = line()).empty();) {
      const auto colon = l.find(':');
      std::string name = l.substr(0, colon);
      for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = l.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      r.headers[name] = value;
    }
    if (r.header("transfer-encoding") == "chunked") {
      for (;;) {
        const size_t n = std::stoul(line(), nullptr, 16);
        if (n == 0) {
          while (!line().empty()) {
          }
          break;
        }
        std::string chunk = take(n);
        line();
        r.chunks.push_back(chunk);
        r.body += chunk;
      }
    } else {
      r.body = take(std::stoul(r.header("content-length").empty() ? "0" : r.header("content-length")));
    }
    if (r.header("content-type").starts_with("text/event-stream")) {
      size_t pos = 0;
      while ((pos = r.body.find("data: ", pos)) != std::string::npos) {
        const size_t end = r.body.find("\n\n", pos);
        r.sse.push_back(r.body.substr(pos + 6, end - pos - 6));
        pos = end;
      }
    }
    return r;
  }

  HttpResponse request(const std::string& method, const std::string& path, const std::string& body = "") {
    send_request(method, path, body);
    return read_response();
  }

  // Reads until `needle` was received (or throws); returns what was read.
  std::string read_until(const std::string& needle) {
    while (buf_.find(needle) == std::string::npos) fill();
    return buf_;
  }

  // True if the connection yields no byte within the receive timeout.
  bool silent() {
    char c;
    ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n > 0) buf_.push_back(c);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

 private:
  void fill() {
    char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) throw std::runtime_error("connection closed or timed out");
    buf_.append(tmp, static_cast<size_t>(n));
  }
  std::string line() {
    size_t p;
    while ((p = buf_.find("\r\n")) == std::string::npos) fill();
    std::string l = buf_.substr(0, p);
    buf_.erase(0, p + 2);
    return l;
  }
  std::string take(size_t n) {
    while (buf_.size() < n) fill();
    std::string s = buf_.substr(0, n);
    buf_.erase(0, n);
    return s;
  }

  int fd_ = -1;
  std::string buf_;
};

inline HttpResponse http_request(uint16_t port, const std::string& method, const std::string& path,
                                 const std::string& body = "") {
  HttpConnection c(port);
  return c.request(method, path, body);
}

}  // namespace kvroute::testing
