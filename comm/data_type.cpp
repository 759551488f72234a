#include "comm/data_type.hpp"

namespace shardplan::comm {

std::size_t element_bytes(DataType type) {
  switch (type) {
  case DataType::f32:
    return 4;
  case DataType::f64:
    return 8;
  case DataType::bf16:
  case DataType::f16:
    return 2;
  case DataType::i32:
    return 4;
  case DataType::i64:
    return 8;
  case DataType::u8:
    return 1;
  }
  return 1;
}

const char* data_type_name(DataType type) {
  switch (type) {
  case DataType::f32:
    return "float";
  case DataType::f64:
    return "double";
  case DataType::bf16:
    return "bfloat16";
  case DataType::f16:
    return "half";
  case DataType::i32:
    return "int32";
  case DataType::i64:
    return "int64";
  case DataType::u8:
    return "uint8";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
  case ReduceOp::sum:
    return "sum";
  case ReduceOp::max:
    return "max";
  case ReduceOp::min:
    return "min";
  }
  return "?";
}

}  // namespace shardplan::comm
