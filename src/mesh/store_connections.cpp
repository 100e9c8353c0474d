#include "store_connections.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace dtensor::detail {
namespace {

// An IPv4 address seen through an IPv6 socket (::ffff:a.b.c.d), as the IPv4 address it is: c10d's
// sockets may be either.
sockaddr_storage as_ipv4_if_mapped(const sockaddr_storage& a) {
  if (a.ss_family != AF_INET6) return a;
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
  if (!IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return a;
  sockaddr_storage out{};
  auto& v4 = reinterpret_cast<sockaddr_in&>(out);
  v4.sin_family = AF_INET;
  v4.sin_port = v6.sin6_port;
  std::memcpy(&v4.sin_addr, &v6.sin6_addr.s6_addr[12], 4);
  return out;
}

bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

}  // namespace

StoreConnections::StoreConnections(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    sockaddr_storage address{};
    std::memcpy(&address, a->ai_addr, a->ai_addrlen);
    addresses_.push_back(as_ipv4_if_mapped(address));
  }
  freeaddrinfo(found);
}

int StoreConnections::shut_down() const {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = readdir(fds)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(fds)) continue;
    struct stat info {};
    if (fstat(static_cast<int>(fd), &info) != 0 || !S_ISSOCK(info.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof peer;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    for (const auto& address : addresses_) {
      if (!same_endpoint(as_ipv4_if_mapped(peer), address)) continue;
      shutdown(static_cast<int>(fd), SHUT_RDWR);
      ++count;
      break;
    }
  }
  closedir(fds);
  return count;
}

}  // namespace dtensor::detail
