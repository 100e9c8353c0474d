#pragma once
// The span of a thread blocked in communication: counted by CommunicationTime (dtensor/comm_debug.h)
// and shown to profilers as a user scope "dtensor::<operation>". Only the outermost span of a thread
// counts, so a wait inside a post (a failed batch finishing what started) is not counted twice.

#include <ATen/record_function.h>

#include <chrono>

namespace dtensor::detail {

class CommunicationSpan {
 public:
  explicit CommunicationSpan(const char* operation);
  ~CommunicationSpan();
  CommunicationSpan(const CommunicationSpan&) = delete;
  CommunicationSpan& operator=(const CommunicationSpan&) = delete;

 private:
  at::RecordFunction profiled_;
  std::chrono::steady_clock::time_point start_;
  bool outermost_;
};

}  // namespace dtensor::detail
