// The ZooKeeper backend beyond the conformance suite.
#include <gtest/gtest.h>
