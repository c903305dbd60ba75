/* See README. */
#include <asm-generic/sockios.h>
