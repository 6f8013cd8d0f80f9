#include "megatrain/launch/http_failure.h"

#include <httplib.h>
#include <openssl/x509.h>

#include <fmt/format.h>

namespace mt::launch {

std::string http_failure(const httplib::Result& res, const httplib::Client& client, int connect_timeout_s,
                         int read_timeout_s) {
  switch (res.error()) {
    case httplib::Error::Connection: return "cannot connect (refused, or the host unreachable)";
    case httplib::Error::ConnectionTimeout: return fmt::format("no connection within {} s", connect_timeout_s);
    case httplib::Error::Read: return fmt::format("no answer within {} s", read_timeout_s);
    case httplib::Error::Write: return "the request could not be written";
    case httplib::Error::SSLConnection:
      return "the TLS handshake failed (an http:// server asked with https://, or no protocol in common)";
    case httplib::Error::SSLServerVerification: {
      std::string why = "the server's certificate was refused";
      if (const long v = client.get_openssl_verify_result(); v != X509_V_OK)
        why += fmt::format(" ({})", X509_verify_cert_error_string(v));
      return why;
    }
    default: return httplib::to_string(res.error());
  }
}

bool certificate_refused(const httplib::Result& res) { return res.error() == httplib::Error::SSLServerVerification; }

}  // namespace mt::launch
