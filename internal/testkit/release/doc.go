// Package release holds the checks of a release: TestInstallFromAModuleProxy
// serves the repository's released modules (the library, cmd/oncekit and
// oncekitotel) at the version their go.mod files require from a module
// proxy made of the checkout, and installs and builds them outside it, as a
// user's `go install` and `go get` do. `make release` runs it before it
// tags.
package release
