package nvrm

import (
	"strings"
	"testing"
)

// The channel-class rule holds every GPFIFO channel class named and no
// other class.
func TestChannelClassesAreTheGPFIFOClasses(t *testing.T) {
	for class, name := range classNames {
		if IsChannelClass(class) != strings.Contains(name, "CHANNEL_GPFIFO") {
			t.Errorf("%s (0x%04x): IsChannelClass %v", name, class, IsChannelClass(class))
		}
	}
}
