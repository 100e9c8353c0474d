#pragma once
// nlohmann/json for dtensor's code, configured as nlohmann ships it. The readers of untrusted JSON name
// the place of every problem themselves (JsonField's paths; the .pt2 decoder's rescan, json_pull.h),
// so nlohmann's JSON_DIAGNOSTICS (a parent pointer in every value, kept up on every change) is off.
#include <nlohmann/json.hpp>
