package idemmcp

// SetWaitHook makes every duplicate that starts waiting for the running call
// with its key call hook first (nil removes it).
func SetWaitHook(hook func()) { waitHook = hook }
