package deploy_test

import (
	"encoding/json"
	"fmt"

	"github.com/oncekit/oncekit/deploy"
)

// The dashboard ships inside the module, for tools that install it.
func Example() {
	var dash struct {
		Title string `json:"title"`
		UID   string `json:"uid"`
	}
	if err := json.Unmarshal(deploy.Dashboard, &dash); err != nil {
		panic(err)
	}
	fmt.Println(dash.Title, dash.UID)
	// Output: oncekit oncekit
}
