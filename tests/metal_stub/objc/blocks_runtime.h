#include <Block.h>  // GNUstep expects the blocks runtime here; Debian installs it as <Block.h>
