#include <string>

#include "communication_span.h"
#include "dtensor/comm_debug.h"

namespace dtensor {
namespace {
thread_local CommunicationTime* g_counting = nullptr;
thread_local bool g_in_span = false;
}  // namespace

CommunicationTime::CommunicationTime() : previous_(g_counting) { g_counting = this; }
CommunicationTime::~CommunicationTime() { g_counting = previous_; }

void CommunicationTime::add(double seconds) {
  for (CommunicationTime* t = g_counting; t != nullptr; t = t->previous_) t->seconds_ += seconds;
}

namespace detail {

CommunicationSpan::CommunicationSpan(const char* operation)
    : profiled_(at::RecordScope::USER_SCOPE), start_(std::chrono::steady_clock::now()), outermost_(!g_in_span) {
  if (profiled_.isActive()) profiled_.before(std::string("dtensor::") + operation);
  g_in_span = true;
}

CommunicationSpan::~CommunicationSpan() {
  if (!outermost_) return;
  g_in_span = false;
  CommunicationTime::add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
}

}  // namespace detail
}  // namespace dtensor
