// Why a request made with cpp-httplib's client got no answer, in words a person can act on. httplib names its
// errors in one word ("Connection", "SSLServerVerification"); the webhook's notifier (notifier.h) and
// `megatrain status` both say instead what happened, and for a refused certificate, OpenSSL's reason
// ("self-signed certificate", "certificate has expired").
#pragma once
#include <string>

namespace httplib {
class Client;
class Result;
}  // namespace httplib

namespace mt::launch {

// `res` must hold no response (a failed request). The timeouts are the ones the client was given, for the text.
std::string http_failure(const httplib::Result& res, const httplib::Client& client, int connect_timeout_s,
                         int read_timeout_s);
// True when the failure was a refused certificate: asking again gets the same answer.
bool certificate_refused(const httplib::Result& res);

}  // namespace mt::launch
