#pragma once
// One item of a DCP checkpoint's .distcp file: a torch.save'd zip archive at a byte range, opened by the
// zip reader confined to that range, with its data.pkl run by the restricted unpickler. What tensor
// items (dcp_load.cpp) and bytes entries (dcp_objects.cpp) share.

#include <memory>
#include <string>

#include "../io/restricted_pickle.h"
#include "../io/zip_archive.h"
#include "dtensor/dcp.h"

namespace dtensor::checkpoint::dcp::detail {

struct SavedItem {
  std::unique_ptr<io::ZipArchive> zip;
  io::PickleTree tree;  // data.pkl's values
};

// `what` names the item in errors ("item 'w' at [0, 0]"). Refuses transformed items, another byte
// order, a missing data.pkl and whatever `rules` refuse.
SavedItem open_saved_item(const std::string& dir, const DcpStorage& storage, const std::string& what, const io::PickleRules& rules);

}  // namespace dtensor::checkpoint::dcp::detail
