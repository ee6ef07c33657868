//go:build !oncelanded

package consume

import "time"

// Stand-ins for what package once says of its errors, until it is on main.

func stored(error) bool                      { return false }
func omitted(error) bool                     { return false }
func invalidKey(error) bool                  { return false }
func retryAfter(error) (time.Duration, bool) { return 0, false }
