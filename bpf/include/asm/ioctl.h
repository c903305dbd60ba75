/* See README. */
#include <asm-generic/ioctl.h>
