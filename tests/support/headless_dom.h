// The dashboard's page as a real browser renders it: Debian's chromium (scripts/setup installs it), headless, prints
// the DOM once the page's scripts ran (its first /api/job fetch is answered before the virtual time budget runs out).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "files.h"

namespace mt::test {

inline std::string rendered_dom(const std::string& url, const std::filesystem::path& dir) {
  const char* candidates[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"};
  std::string browser;
  for (const char* c : candidates)
    if (std::filesystem::exists(c)) browser = c;
  if (browser.empty()) {
    ADD_FAILURE() << "no chromium: scripts/setup installs Debian's (apt-get install chromium)";
    return "";
  }
  const std::filesystem::path out = dir / "dom.html", log = dir / "chromium.log";
  // --no-sandbox: the suite may run as root, where chromium's sandbox refuses to start. A profile of its own, so
  // parallel tests never share one.
  const std::string cmd =
      fmt::format("timeout 120 {} --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir={} "
                  "--virtual-time-budget=5000 --dump-dom '{}' > {} 2> {}",
                  browser, (dir / "profile").string(), url, out.string(), log.string());
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << "\n" << slurp(log);
  return slurp(out);
}

}  // namespace mt::test
