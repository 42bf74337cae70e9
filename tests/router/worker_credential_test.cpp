// router/http/worker_credential.h: which credential fields a forwarded
// request carries (the worker key, never the client's unless asked), reading
// the key from a file or the environment (trimmed; a key that would break the
// header refused, naming the config key, never the secret), a failed re-read
// keeping the key in force and counted, and the config's checks of the three
// keys.
#include "router/http/worker_credential.h"
#include "tests/support/temp_file.h"

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

using namespace kvroute;
using kvroute::testing::temp_file;

TEST_CASE("worker credential: the worker key, never the client's fields unless forwarding is asked") {
  const std::string client = "Authorization: Bearer sk-client\r\nx-api-key: sk-client\r\n";
  WorkerCredential::Key none;
  CHECK(worker_credential_fields(none, false, client).empty());
  CHECK(worker_credential_fields(none, true, client) == client);
  CHECK(worker_authorization(none, false, "Bearer sk-client").empty());
  CHECK(worker_authorization(none, true, "Bearer sk-client") == "Bearer sk-client");
  WorkerCredential::Key key;
  RouterConfig rc;
  const std::string path = temp_file("  sk-worker-1 \n second line ignored\n");
  rc.worker_api_key_file = path;
  REQUIRE_FALSE(WorkerCredential::read_key(rc, key).has_value());
  CHECK(key.authorization == "Bearer sk-worker-1");
  CHECK(key.fields == "Authorization: Bearer sk-worker-1\r\n");
  CHECK(worker_credential_fields(key, false, client) == key.fields);
  CHECK(worker_credential_fields(key, true, client) == key.fields);  // a worker key replaces the client's
  CHECK(worker_authorization(key, true, "Bearer sk-client") == "Bearer sk-worker-1");
  Config cfg;
  CHECK_FALSE(forwards_client_credentials(cfg));
  cfg.router.forward_client_credentials = true;
  CHECK(forwards_client_credentials(cfg));
  cfg.flow.keys_file = "/etc/keys";
  CHECK_FALSE(forwards_client_credentials(cfg));  // never with API keys, whatever the flag says
  std::remove(path.c_str());
}

TEST_CASE("worker credential: bad keys are refused naming the config key, never showing the key") {
  WorkerCredential::Key key;
  RouterConfig rc;
  rc.worker_api_key_file = "/nonexistent/kvroute/worker.key";
  CHECK(WorkerCredential::read_key(rc, key).value().find("router.worker_api_key_file") != std::string::npos);
  const std::vector<std::string> bad_keys{"\n", "two words\n", "tab\there\n", std::string(5000, 'k') + "\n"};
  for (const std::string& bad : bad_keys) {
    const std::string path = temp_file(bad);
    rc.worker_api_key_file = path;
    const auto e = WorkerCredential::read_key(rc, key);
    REQUIRE(e.has_value());
    CHECK(e->find("router.worker_api_key_file") != std::string::npos);
    CHECK(e->find("words") == std::string::npos);
    std::remove(path.c_str());
  }
  rc = RouterConfig{};
  rc.worker_api_key_env = "KVROUTE_TEST_WORKER_KEY_UNSET_6c1f";
  ::unsetenv(rc.worker_api_key_env.c_str());
  CHECK(WorkerCredential::read_key(rc, key).value().find("router.worker_api_key_env") != std::string::npos);
  ::setenv(rc.worker_api_key_env.c_str(), "sk-from-env", 1);
  REQUIRE_FALSE(WorkerCredential::read_key(rc, key).has_value());
  CHECK(key.authorization == "Bearer sk-from-env");
  ::unsetenv(rc.worker_api_key_env.c_str());
  // Neither set: no key.
  REQUIRE_FALSE(WorkerCredential::read_key(RouterConfig{}, key).has_value());
  CHECK(key.fields.empty());
}

TEST_CASE("worker credential: a re-read that fails keeps the key in force; a config change re-reads") {
  const std::string path = temp_file("sk-one\n");
  auto cfg = std::make_shared<Config>();
  cfg->router.worker_api_key_file = path;
  WorkerCredential wc;
  REQUIRE_FALSE(wc.reload(cfg).has_value());
  CHECK(wc.get(cfg)->authorization == "Bearer sk-one");
  CHECK(wc.reload_failures() == 0);
  std::ofstream(path) << "bad key\n";
  CHECK(wc.reload(cfg).has_value());  // SIGHUP
  CHECK(wc.reload_failures() == 1);
  CHECK(wc.get(cfg)->authorization == "Bearer sk-one");
  CHECK(wc.reload_failures() == 1);  // the same Config: no re-read, nothing counted
  auto changed = std::make_shared<Config>(*cfg);  // a config change re-reads, and fails again
  CHECK(wc.get(changed)->authorization == "Bearer sk-one");
  CHECK(wc.reload_failures() == 2);
  std::ofstream(path) << "sk-two\n";
  auto next = std::make_shared<Config>(*cfg);  // another Config (a reload through the admin API)
  CHECK(wc.get(next)->authorization == "Bearer sk-two");
  CHECK(wc.reload_failures() == 2);  // a good re-read is no failure
  std::remove(path.c_str());
}

TEST_CASE("config: the worker key's sources exclude each other and forwarding the client's") {
  Config c;
  c.router.worker_api_key_file = "/k";
  c.router.worker_api_key_env = "K";
  CHECK(validate(c).value().find("router.worker_api_key_file") != std::string::npos);
  c.router.worker_api_key_env.clear();
  c.router.forward_client_credentials = true;
  CHECK(validate(c).value().find("router.forward_client_credentials") != std::string::npos);
  c.router.worker_api_key_file.clear();
  CHECK_FALSE(validate(c).has_value());
  c.flow.keys_file = "/keys";
  CHECK(validate(c).value().find("router.forward_client_credentials") != std::string::npos);
  // The effective config shows where the key is read from, and has no field for the key itself.
  c = Config{};
  c.router.worker_api_key_file = "/run/secrets/worker.key";
  CHECK(to_yaml(c).find("worker_api_key_file: \"/run/secrets/worker.key\"") != std::string::npos);
}
