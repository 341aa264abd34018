// The registry of every technique memtrade is built with (the composition root's list).
#pragma once

#include "harness/registry.hpp"

namespace memtrade {

const Registry& registry();

}  // namespace memtrade
