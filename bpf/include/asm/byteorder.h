/* See README: bpfel is little-endian. */
#include <linux/byteorder/little_endian.h>
