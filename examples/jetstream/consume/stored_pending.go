//go:build !oncelanded

package consume

// stored stands for once.ErrStored until package once is on main.
func stored(error) bool { return false }
