#include "common/url_allow_list.h"

#include <doctest/doctest.h>

using namespace kvroute;

TEST_CASE("worker URL allow list: CIDRs, addresses, origins, any") {
  auto l = UrlAllowList::parse("10.0.0.0/8, 192.168.1.7, fd00::/8, http://vllm-0.llm:8000, http://[::1]:9000");
  REQUIRE(l.has_value());
  CHECK(l->allows("http://10.1.2.3:8000"));
  CHECK(l->allows("http://10.255.255.255"));
  CHECK_FALSE(l->allows("http://11.0.0.1:8000"));
  CHECK(l->allows("http://192.168.1.7:1"));
  CHECK_FALSE(l->allows("http://192.168.1.8:1"));
  CHECK(l->allows("http://[fd12::5]:8000/base"));
  CHECK_FALSE(l->allows("http://[fe80::1]:8000"));
  CHECK(l->allows("http://VLLM-0.llm:8000"));      // host names compare without case
  CHECK_FALSE(l->allows("http://vllm-0.llm:8001"));  // another port is another origin
  CHECK_FALSE(l->allows("http://vllm-1.llm:8000"));  // a name is never resolved
  CHECK(l->allows("http://[::1]:9000"));
  CHECK_FALSE(l->allows("http://[::1]:9001"));
  CHECK_FALSE(l->allows("https://10.1.2.3:8000"));  // not a worker URL kvroute can use
  CHECK_FALSE(l->allows("garbage"));
  // An IPv4 address written as IPv4-mapped IPv6 is the same address.
  CHECK(l->allows("http://[::ffff:10.0.0.1]:8000"));

  auto loop = UrlAllowList::parse("127.0.0.0/8,::1");
  REQUIRE(loop.has_value());
  CHECK(loop->allows("http://127.0.0.1:8000"));
  CHECK(loop->allows("http://127.9.9.9:1"));
  CHECK(loop->allows("http://[::1]:8000"));
  CHECK_FALSE(loop->allows("http://10.0.0.1:8000"));
  CHECK_FALSE(loop->allows("http://localhost:8000"));

  auto any = UrlAllowList::parse("*");
  REQUIRE(any.has_value());
  CHECK(any->allows_any());
  CHECK(any->allows("http://anything:1"));
  auto none = UrlAllowList::parse("");
  REQUIRE(none.has_value());
  CHECK(none->empty());
  CHECK_FALSE(none->allows("http://127.0.0.1:1"));

  std::string error;
  CHECK_FALSE(UrlAllowList::parse("10.0.0.0/33", &error).has_value());
  CHECK(error.find("10.0.0.0/33") != std::string::npos);
  CHECK_FALSE(UrlAllowList::parse("10.0.0.0/x").has_value());
  CHECK_FALSE(UrlAllowList::parse("host-name").has_value());
  CHECK_FALSE(UrlAllowList::parse("http://a:1/path").has_value());
  // Prefixes that end inside a byte.
  auto odd = UrlAllowList::parse("10.128.0.0/9");
  REQUIRE(odd.has_value());
  CHECK(odd->allows("http://10.200.0.1:1"));
  CHECK_FALSE(odd->allows("http://10.100.0.1:1"));
}
