#include "mpi_types.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>

#include "dtensor/errors.h"

namespace dtensor::detail::mpi {
namespace {

struct Sum {
  float operator()(float a, float b) const { return a + b; }
};
struct Product {
  float operator()(float a, float b) const { return a * b; }
};
struct Max {  // NaN wins, as in torch.maximum
  float operator()(float a, float b) const { return std::isnan(a) || a > b ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return std::isnan(a) || a < b ? a : b; }
};

// MPI_User_function for 16-bit floats: each pair combined in float and rounded back.
template <typename T, typename Combine>
void combine_in_float(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(Combine{}(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
MPI_Op half_op(c10d::ReduceOp::RedOpType op) {
  static const std::map<c10d::ReduceOp::RedOpType, MPI_Op> ops = [] {
    std::map<c10d::ReduceOp::RedOpType, MPI_Op> made;
    const auto make = [](MPI_User_function* f) {
      MPI_Op o;
      MPI_Op_create(f, /*commute=*/1, &o);
      return o;
    };
    made[c10d::ReduceOp::SUM] = make(&combine_in_float<T, Sum>);
    made[c10d::ReduceOp::PRODUCT] = make(&combine_in_float<T, Product>);
    made[c10d::ReduceOp::MAX] = make(&combine_in_float<T, Max>);
    made[c10d::ReduceOp::MIN] = make(&combine_in_float<T, Min>);
    return made;
  }();
  const auto it = ops.find(op);
  return it == ops.end() ? MPI_OP_NULL : it->second;
}

MPI_Datatype datatype_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kShort: return MPI_INT16_T;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kComplexFloat: return MPI_C_FLOAT_COMPLEX;
    case at::kComplexDouble: return MPI_C_DOUBLE_COMPLEX;
    case at::kHalf:
    case at::kBFloat16: return MPI_UINT16_T;  // reduced by dtensor's own operations
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op builtin_op(at::ScalarType dtype, c10d::ReduceOp::RedOpType op) {
  if (dtype == at::kBool) {  // logical: a sum of flags is "any", a product "all"
    if (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MAX || op == c10d::ReduceOp::BOR) return MPI_LOR;
    if (op == c10d::ReduceOp::PRODUCT || op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::BAND) return MPI_LAND;
    if (op == c10d::ReduceOp::BXOR) return MPI_LXOR;
    return MPI_OP_NULL;
  }
  const bool complex = at::isComplexType(dtype), integral = at::isIntegralType(dtype, /*includeBool=*/false);
  switch (op) {
    case c10d::ReduceOp::SUM: return MPI_SUM;
    case c10d::ReduceOp::PRODUCT: return MPI_PROD;
    case c10d::ReduceOp::MAX: return complex ? MPI_OP_NULL : MPI_MAX;
    case c10d::ReduceOp::MIN: return complex ? MPI_OP_NULL : MPI_MIN;
    case c10d::ReduceOp::BAND: return integral ? MPI_BAND : MPI_OP_NULL;
    case c10d::ReduceOp::BOR: return integral ? MPI_BOR : MPI_OP_NULL;
    case c10d::ReduceOp::BXOR: return integral ? MPI_BXOR : MPI_OP_NULL;
    default: return MPI_OP_NULL;
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED"};
  return op <= c10d::ReduceOp::UNUSED ? names[op] : "?";
}

}  // namespace

Reduction reduction_for(at::ScalarType dtype, const c10d::ReduceOp& op, const char* operation) {
  const MPI_Datatype type = datatype_of(dtype);
  MPI_Op mpi_op = MPI_OP_NULL;
  if (dtype == at::kHalf) mpi_op = half_op<c10::Half>(op.op_);
  else if (dtype == at::kBFloat16) mpi_op = half_op<c10::BFloat16>(op.op_);
  else if (type != MPI_DATATYPE_NULL) mpi_op = builtin_op(dtype, op.op_);
  if (type == MPI_DATATYPE_NULL || mpi_op == MPI_OP_NULL)
    throw DTensorError(std::string("the MPI backend cannot ") + operation + " " + c10::toString(dtype) +
                       " tensors with " + op_name(op.op_) +
                       (op.op_ == c10d::ReduceOp::AVG ? " (sum, then divide by the group size, as Gloo also requires)"
                                                      : "; reduce another dtype or use Gloo (DTENSOR_BACKEND=gloo)"));
  return {type, mpi_op};
}

ByteUnit unit_for(const std::vector<int64_t>& byte_counts, const char* operation) {
  static std::map<int64_t, MPI_Datatype> blocks;  // made once per size, never freed (a handful at most)
  int64_t unit = 1;
  const auto fits = [&] {
    return std::all_of(byte_counts.begin(), byte_counts.end(), [&](int64_t c) { return c % unit == 0 && c / unit <= INT_MAX; });
  };
  while (!fits()) {
    unit *= 2;
    if (unit > (int64_t{1} << 20))
      throw DTensorError(std::string("the MPI backend cannot ") + operation +
                         " these sizes: a message of more than 2 GiB must be a multiple of a power-of-two block "
                         "(split the tensor, or use Gloo)");
  }
  if (unit == 1) return {MPI_BYTE, 1};
  auto block = blocks.find(unit);
  if (block == blocks.end()) {
    MPI_Datatype type;
    MPI_Type_contiguous(static_cast<int>(unit), MPI_BYTE, &type);
    MPI_Type_commit(&type);
    block = blocks.emplace(unit, type).first;
  }
  return {block->second, unit};
}

std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace dtensor::detail::mpi
