package main

// The built-in kinds this server serves, each from etcd through the generic registry
// (k8s.io/apiserver/pkg/registry/generic/registry.Store) with the Go types of k8s.io/api.
//
// kube-apiserver converts every request to an internal type of k8s.io/kubernetes before
// storing it; those types are not packaged. Here the versioned type is registered as its
// own internal version too, so the generic handlers' conversions to and from the "hub"
// version are copies (the same shape sigs.k8s.io/apiserver-runtime uses for its types).

import (
	"context"
	"fmt"
	"reflect"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/storage"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// resource describes one served built-in resource.
type resource struct {
	gv                  schema.GroupVersion
	plural, kind        string
	newObj, newList     func() runtime.Object
	namespaced          bool
	status              bool // has a status subresource
	generation          bool // metadata.generation counts spec changes (kube-apiserver: workloads, pods)
	clearStatusOnCreate bool // kube-apiserver's strategy clears the status on create
	createOnUpdate      bool // PUT of a missing object creates it (kube-apiserver: Events)
	shortNames          []string
	// selectableFields are the field selectors beyond metadata.name and
	// metadata.namespace, as kube-apiserver's strategies list them (GetAttrs).
	selectableFields func(runtime.Object) fields.Set
	onCreate         func(runtime.Object)
	onUpdate         func(obj, old runtime.Object)
	// onStatusUpdate runs on a write of the status subresource.
	onStatusUpdate func(obj, old runtime.Object)
}

var (
	coreV1      = corev1.SchemeGroupVersion
	appsV1      = appsv1.SchemeGroupVersion
	batchV1     = batchv1.SchemeGroupVersion
	coordV1     = coordinationv1.SchemeGroupVersion
	eventsV1    = eventsv1.SchemeGroupVersion
	admissionV1 = admissionregistrationv1.SchemeGroupVersion
	discoveryV1 = discoveryv1.SchemeGroupVersion
	rbacV1      = rbacv1.SchemeGroupVersion
	autoscaleV2 = autoscalingv2.SchemeGroupVersion
	policyV1    = policyv1.SchemeGroupVersion
)

// builtinResources is every built-in resource this server serves.
var builtinResources = []*resource{
	{gv: coreV1, plural: "namespaces", kind: "Namespace", newObj: obj[corev1.Namespace], newList: obj[corev1.NamespaceList],
		status: true, shortNames: []string{"ns"}, onCreate: namespaceOnCreate, onUpdate: namespaceNameLabel,
		selectableFields: func(o runtime.Object) fields.Set {
			return fields.Set{"status.phase": string(o.(*corev1.Namespace).Status.Phase)}
		}},
	{gv: coreV1, plural: "pods", kind: "Pod", newObj: obj[corev1.Pod], newList: obj[corev1.PodList], namespaced: true,
		status: true, clearStatusOnCreate: true, generation: true, shortNames: []string{"po"}, onCreate: func(o runtime.Object) {
			o.(*corev1.Pod).Status.Phase = corev1.PodPending
		}, selectableFields: podFields},
	{gv: coreV1, plural: "secrets", kind: "Secret", newObj: obj[corev1.Secret], newList: obj[corev1.SecretList], namespaced: true,
		onCreate: mergeStringData, onUpdate: func(o, _ runtime.Object) { mergeStringData(o) },
		selectableFields: func(o runtime.Object) fields.Set {
			return fields.Set{"type": string(o.(*corev1.Secret).Type)}
		}},
	{gv: coreV1, plural: "configmaps", kind: "ConfigMap", newObj: obj[corev1.ConfigMap], newList: obj[corev1.ConfigMapList],
		namespaced: true, shortNames: []string{"cm"}},
	{gv: coreV1, plural: "services", kind: "Service", newObj: obj[corev1.Service], newList: obj[corev1.ServiceList],
		namespaced: true, status: true, clearStatusOnCreate: true, shortNames: []string{"svc"}},
	{gv: coreV1, plural: "nodes", kind: "Node", newObj: obj[corev1.Node], newList: obj[corev1.NodeList], status: true,
		shortNames: []string{"no"}, selectableFields: func(o runtime.Object) fields.Set {
			return fields.Set{"spec.unschedulable": strconv.FormatBool(o.(*corev1.Node).Spec.Unschedulable)}
		}},
	{gv: coreV1, plural: "events", kind: "Event", newObj: obj[corev1.Event], newList: obj[corev1.EventList], namespaced: true,
		createOnUpdate: true, shortNames: []string{"ev"}, selectableFields: coreEventFields},
	{gv: coreV1, plural: "serviceaccounts", kind: "ServiceAccount", newObj: obj[corev1.ServiceAccount],
		newList: obj[corev1.ServiceAccountList], namespaced: true, shortNames: []string{"sa"}},
	{gv: appsV1, plural: "deployments", kind: "Deployment", newObj: obj[appsv1.Deployment], newList: obj[appsv1.DeploymentList],
		namespaced: true, status: true, clearStatusOnCreate: true, generation: true, shortNames: []string{"deploy"}},
	{gv: coreV1, plural: "persistentvolumeclaims", kind: "PersistentVolumeClaim", newObj: obj[corev1.PersistentVolumeClaim],
		newList: obj[corev1.PersistentVolumeClaimList], namespaced: true, status: true, clearStatusOnCreate: true,
		shortNames: []string{"pvc"}},
	{gv: coreV1, plural: "persistentvolumes", kind: "PersistentVolume", newObj: obj[corev1.PersistentVolume],
		newList: obj[corev1.PersistentVolumeList], status: true, clearStatusOnCreate: true, shortNames: []string{"pv"},
		onCreate: persistentVolumeOnCreate, onStatusUpdate: persistentVolumePhaseTransition},
	{gv: appsV1, plural: "daemonsets", kind: "DaemonSet", newObj: obj[appsv1.DaemonSet], newList: obj[appsv1.DaemonSetList],
		namespaced: true, status: true, clearStatusOnCreate: true, generation: true, shortNames: []string{"ds"}},
	{gv: appsV1, plural: "statefulsets", kind: "StatefulSet", newObj: obj[appsv1.StatefulSet], newList: obj[appsv1.StatefulSetList],
		namespaced: true, status: true, clearStatusOnCreate: true, generation: true, shortNames: []string{"sts"}},
	{gv: appsV1, plural: "replicasets", kind: "ReplicaSet", newObj: obj[appsv1.ReplicaSet], newList: obj[appsv1.ReplicaSetList],
		namespaced: true, status: true, clearStatusOnCreate: true, generation: true, shortNames: []string{"rs"}},
	{gv: batchV1, plural: "jobs", kind: "Job", newObj: obj[batchv1.Job], newList: obj[batchv1.JobList], namespaced: true,
		status: true, clearStatusOnCreate: true, generation: true, selectableFields: func(o runtime.Object) fields.Set {
			return fields.Set{"status.successful": strconv.Itoa(int(o.(*batchv1.Job).Status.Succeeded))}
		}},
	{gv: coordV1, plural: "leases", kind: "Lease", newObj: obj[coordinationv1.Lease], newList: obj[coordinationv1.LeaseList],
		namespaced: true},
	{gv: eventsV1, plural: "events", kind: "Event", newObj: obj[eventsv1.Event], newList: obj[eventsv1.EventList],
		namespaced: true, createOnUpdate: true, shortNames: []string{"ev"}, selectableFields: eventsV1Fields},
	{gv: admissionV1, plural: "validatingwebhookconfigurations", kind: "ValidatingWebhookConfiguration",
		newObj: obj[admissionregistrationv1.ValidatingWebhookConfiguration], newList: obj[admissionregistrationv1.ValidatingWebhookConfigurationList]},
	{gv: admissionV1, plural: "mutatingwebhookconfigurations", kind: "MutatingWebhookConfiguration",
		newObj: obj[admissionregistrationv1.MutatingWebhookConfiguration], newList: obj[admissionregistrationv1.MutatingWebhookConfigurationList]},
	// Admission policies, enforced by the ValidatingAdmissionPolicy plugin (main.go). Both
	// count spec changes in metadata.generation; a policy's status is cleared on create
	// (pkg/registry/admissionregistration/validatingadmissionpolicy{,binding}/strategy.go of
	// Kubernetes v1.36).
	{gv: admissionV1, plural: "validatingadmissionpolicies", kind: "ValidatingAdmissionPolicy",
		newObj: obj[admissionregistrationv1.ValidatingAdmissionPolicy], newList: obj[admissionregistrationv1.ValidatingAdmissionPolicyList],
		status: true, clearStatusOnCreate: true, generation: true},
	{gv: admissionV1, plural: "validatingadmissionpolicybindings", kind: "ValidatingAdmissionPolicyBinding",
		newObj:  obj[admissionregistrationv1.ValidatingAdmissionPolicyBinding],
		newList: obj[admissionregistrationv1.ValidatingAdmissionPolicyBindingList], generation: true},
	{gv: discoveryV1, plural: "endpointslices", kind: "EndpointSlice", newObj: obj[discoveryv1.EndpointSlice],
		newList: obj[discoveryv1.EndpointSliceList], namespaced: true},
	// RBAC: writes go through the escalation checks of rbac.go (kube-apiserver's policybased storage).
	{gv: rbacV1, plural: "roles", kind: "Role", newObj: obj[rbacv1.Role], newList: obj[rbacv1.RoleList], namespaced: true},
	{gv: rbacV1, plural: "rolebindings", kind: "RoleBinding", newObj: obj[rbacv1.RoleBinding],
		newList: obj[rbacv1.RoleBindingList], namespaced: true},
	{gv: rbacV1, plural: "clusterroles", kind: "ClusterRole", newObj: obj[rbacv1.ClusterRole], newList: obj[rbacv1.ClusterRoleList]},
	{gv: rbacV1, plural: "clusterrolebindings", kind: "ClusterRoleBinding", newObj: obj[rbacv1.ClusterRoleBinding],
		newList: obj[rbacv1.ClusterRoleBindingList]},
	// HPA: pkg/registry/autoscaling/horizontalpodautoscaler/strategy.go (status cleared on
	// create; metadata.generation only behind the HPAGeneration feature gate, whose v1.36
	// default is unchecked: not set here).
	{gv: autoscaleV2, plural: "horizontalpodautoscalers", kind: "HorizontalPodAutoscaler",
		newObj: obj[autoscalingv2.HorizontalPodAutoscaler], newList: obj[autoscalingv2.HorizontalPodAutoscalerList],
		namespaced: true, status: true, clearStatusOnCreate: true, shortNames: []string{"hpa"}},
	// PDB: pkg/registry/policy/poddisruptionbudget/strategy.go of Kubernetes v1.36.
	{gv: policyV1, plural: "poddisruptionbudgets", kind: "PodDisruptionBudget", newObj: obj[policyv1.PodDisruptionBudget],
		newList: obj[policyv1.PodDisruptionBudgetList], namespaced: true, status: true, clearStatusOnCreate: true,
		generation: true, shortNames: []string{"pdb"}},
}

// The review kinds of authorization.k8s.io (sar.go): created, answered by the authorizer and
// never stored. Registered on the scheme like the stored kinds.
var reviewKinds = []runtime.Object{
	&authorizationv1.SubjectAccessReview{}, &authorizationv1.SelfSubjectAccessReview{},
	&authorizationv1.LocalSubjectAccessReview{},
}

// persistentVolumeOnCreate: a new PersistentVolume is Pending since now
// (pkg/registry/core/persistentvolume/strategy.go of Kubernetes v1.36, PrepareForCreate; the
// PersistentVolumeLastPhaseTransitionTime feature is GA).
func persistentVolumeOnCreate(o runtime.Object) {
	pv := o.(*corev1.PersistentVolume)
	now := metav1.Now()
	pv.Status.Phase = corev1.VolumePending
	pv.Status.LastPhaseTransitionTime = &now
}

// persistentVolumePhaseTransition: the status subresource keeps lastPhaseTransitionTime while
// the phase stays, and sets it to now when the phase changes and the writer did not set it
// (the same file, persistentvolumeStatusStrategy.PrepareForUpdate).
func persistentVolumePhaseTransition(o, old runtime.Object) {
	pv, oldPv := o.(*corev1.PersistentVolume), old.(*corev1.PersistentVolume)
	switch {
	case oldPv.Status.Phase == pv.Status.Phase && pv.Status.LastPhaseTransitionTime == nil:
		pv.Status.LastPhaseTransitionTime = oldPv.Status.LastPhaseTransitionTime
	case oldPv.Status.Phase != pv.Status.Phase && (pv.Status.LastPhaseTransitionTime == nil ||
		pv.Status.LastPhaseTransitionTime.Equal(oldPv.Status.LastPhaseTransitionTime)):
		now := metav1.Now()
		pv.Status.LastPhaseTransitionTime = &now
	}
}

func obj[T any, P interface {
	*T
	runtime.Object
}]() runtime.Object {
	return P(new(T))
}

// mergeStringData moves a Secret's write-only stringData into data, as kube-apiserver's
// conversion of every Secret write does (pkg/apis/core/v1/conversion.go of Kubernetes
// v1.36, Convert_v1_Secret_To_core_Secret).
func mergeStringData(o runtime.Object) {
	secret := o.(*corev1.Secret)
	if len(secret.StringData) == 0 {
		return
	}
	if secret.Data == nil {
		secret.Data = map[string][]byte{}
	}
	for k, v := range secret.StringData {
		secret.Data[k] = []byte(v)
	}
	secret.StringData = nil
}

// podFields: pkg/registry/core/pod/strategy.go (ToSelectableFields) of Kubernetes v1.36.
func podFields(o runtime.Object) fields.Set {
	p := o.(*corev1.Pod)
	return fields.Set{
		"spec.nodeName":            p.Spec.NodeName,
		"spec.restartPolicy":       string(p.Spec.RestartPolicy),
		"spec.schedulerName":       p.Spec.SchedulerName,
		"spec.serviceAccountName":  p.Spec.ServiceAccountName,
		"spec.hostNetwork":         strconv.FormatBool(p.Spec.HostNetwork),
		"status.phase":             string(p.Status.Phase),
		"status.podIP":             p.Status.PodIP,
		"status.nominatedNodeName": p.Status.NominatedNodeName,
	}
}

// coreEventFields: pkg/registry/core/event/strategy.go (ToSelectableFields) of Kubernetes v1.36.
func coreEventFields(o runtime.Object) fields.Set {
	e := o.(*corev1.Event)
	return fields.Set{
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"reportingComponent":             e.ReportingController,
		"source":                         e.Source.Component,
		"type":                           e.Type,
	}
}

// eventsV1Fields: the events.k8s.io/v1 names of the same fields
// (pkg/apis/events/v1/conversion.go of Kubernetes v1.36).
func eventsV1Fields(o runtime.Object) fields.Set {
	e := o.(*eventsv1.Event)
	return fields.Set{
		"regarding.kind":            e.Regarding.Kind,
		"regarding.namespace":       e.Regarding.Namespace,
		"regarding.name":            e.Regarding.Name,
		"regarding.uid":             string(e.Regarding.UID),
		"regarding.apiVersion":      e.Regarding.APIVersion,
		"regarding.resourceVersion": e.Regarding.ResourceVersion,
		"regarding.fieldPath":       e.Regarding.FieldPath,
		"reason":                    e.Reason,
		"reportingController":       e.ReportingController,
		"type":                      e.Type,
	}
}

// Scheme holds the served built-in types, each as its versioned and its internal kind.
var (
	Scheme = runtime.NewScheme()
	Codecs = serializer.NewCodecFactory(Scheme)
)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	Scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, coordinationv1.AddToScheme,
		eventsv1.AddToScheme, admissionregistrationv1.AddToScheme, discoveryv1.AddToScheme,
		rbacv1.AddToScheme, autoscalingv2.AddToScheme, policyv1.AddToScheme, authorizationv1.AddToScheme,
		authenticationv1.AddToScheme,
	} {
		utilruntime.Must(add(Scheme))
	}
	for _, o := range reviewKinds {
		Scheme.AddKnownTypes(schema.GroupVersion{Group: authorizationv1.GroupName, Version: runtime.APIVersionInternal}, o)
		utilruntime.Must(Scheme.AddConversionFunc(o, o, copyObject))
	}
	selfReview := &authenticationv1.SelfSubjectReview{}
	Scheme.AddKnownTypes(schema.GroupVersion{Group: authenticationv1.GroupName, Version: runtime.APIVersionInternal}, selfReview)
	utilruntime.Must(Scheme.AddConversionFunc(selfReview, selfReview, copyObject))
	for _, r := range builtinResources {
		internal := schema.GroupVersion{Group: r.gv.Group, Version: runtime.APIVersionInternal}
		for _, o := range []runtime.Object{r.newObj(), r.newList()} {
			Scheme.AddKnownTypes(internal, o)
			utilruntime.Must(Scheme.AddConversionFunc(o, o, copyObject))
		}
		labels := selectableLabels(r)
		utilruntime.Must(Scheme.AddFieldLabelConversionFunc(r.gv.WithKind(r.kind), func(label, value string) (string, string, error) {
			if labels[label] {
				return label, value, nil
			}
			return "", "", fmt.Errorf("field label not supported: %s", label)
		}))
	}
}

// copyObject converts an object to its own type: the internal and versioned kinds share
// one Go type.
func copyObject(in, out interface{}, _ conversion.Scope) error {
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(in).Elem())
	return nil
}

func selectableLabels(r *resource) map[string]bool {
	set := map[string]bool{"metadata.name": true, "metadata.namespace": true}
	if r.selectableFields != nil {
		for k := range r.selectableFields(r.newObj()) {
			set[k] = true
		}
	}
	return set
}

// getAttrs is the generic registry's view of an object for label and field selectors.
func (r *resource) getAttrs(o runtime.Object) (labels.Set, fields.Set, error) {
	m, err := meta.Accessor(o)
	if err != nil {
		return nil, nil, err
	}
	set := fields.Set{"metadata.name": m.GetName()}
	if r.namespaced {
		set["metadata.namespace"] = m.GetNamespace()
	}
	if r.selectableFields != nil {
		for k, v := range r.selectableFields(o) {
			set[k] = v
		}
	}
	return labels.Set(m.GetLabels()), set, nil
}

// mainREST is the storage of a resource itself.
type mainREST struct {
	*genericregistry.Store
	shortNames []string
}

func (r *mainREST) ShortNames() []string { return r.shortNames }

// subresourceREST is the storage of a subresource (status, finalize): read, and update
// through its own strategy.
type subresourceREST struct{ store *genericregistry.Store }

func (r *subresourceREST) New() runtime.Object { return r.store.New() }
func (r *subresourceREST) Destroy()            {}
func (r *subresourceREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return r.store.Get(ctx, name, options)
}
func (r *subresourceREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo,
	createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc,
	_ bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	// Subresources never create the object.
	return r.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}
func (r *subresourceREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return r.store.GetResetFields()
}
func (r *subresourceREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return r.store.ConvertToTable(ctx, object, tableOptions)
}

// newStores builds the storage of one resource: path ("pods", "pods/status") -> storage.
func newStores(r *resource, optsGetter generic.RESTOptionsGetter) (map[string]rest.Storage, error) {
	s := newStrategy(Scheme, r)
	gr := schema.GroupResource{Group: r.gv.Group, Resource: r.plural}
	store := &genericregistry.Store{
		NewFunc:                   r.newObj,
		NewListFunc:               r.newList,
		DefaultQualifiedResource:  gr,
		SingularQualifiedResource: schema.GroupResource{Group: r.gv.Group, Resource: singular(r.kind)},
		PredicateFunc: func(label labels.Selector, field fields.Selector) storage.SelectionPredicate {
			return storage.SelectionPredicate{Label: label, Field: field, GetAttrs: r.getAttrs}
		},
		CreateStrategy:      s,
		UpdateStrategy:      s,
		DeleteStrategy:      s,
		ResetFieldsStrategy: s,
		TableConvertor:      rest.NewDefaultTableConvertor(gr),
	}
	if err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: r.getAttrs}); err != nil {
		return nil, fmt.Errorf("%s: %w", gr, err)
	}
	if r.kind == "Namespace" {
		store.ShouldDeleteDuringUpdate = namespaceShouldDeleteDuringUpdate
	}
	main := &mainREST{Store: store, shortNames: r.shortNames}
	stores := map[string]rest.Storage{r.plural: main}
	if r.kind == "Namespace" {
		stores[r.plural] = &namespaceREST{mainREST: main}
		finalize := *store
		fs := finalizeStrategy{s}
		finalize.UpdateStrategy, finalize.ResetFieldsStrategy = fs, fs
		stores[r.plural+"/finalize"] = &subresourceREST{store: &finalize}
	}
	if r.status {
		status := *store
		ss := statusStrategy{s}
		status.UpdateStrategy, status.ResetFieldsStrategy = ss, ss
		stores[r.plural+"/status"] = &subresourceREST{store: &status}
	}
	return stores, nil
}

func singular(kind string) string {
	b := []byte(kind)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// builtinGroups builds the API groups to install: the legacy core group first, then the
// named groups. The RBAC resources are wrapped in their escalation checks (rbac.go), which
// ask authz; authorization.k8s.io serves the reviews answered by authz (sar.go).
func builtinGroups(optsGetter generic.RESTOptionsGetter, authz authorizer.Authorizer) (core *genericapiserver.APIGroupInfo, named []*genericapiserver.APIGroupInfo, err error) {
	byGroup := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	group := func(gv schema.GroupVersion) map[string]rest.Storage {
		info, ok := byGroup[gv.Group]
		if !ok {
			i := genericapiserver.NewDefaultAPIGroupInfo(gv.Group, Scheme, metav1.ParameterCodec, Codecs)
			info = &i
			info.PrioritizedVersions = []schema.GroupVersion{gv}
			info.VersionedResourcesStorageMap[gv.Version] = map[string]rest.Storage{}
			byGroup[gv.Group] = info
			order = append(order, gv.Group)
		}
		return info.VersionedResourcesStorageMap[gv.Version]
	}
	roles := &registryRoles{}
	for _, r := range builtinResources {
		stores, err := newStores(r, optsGetter)
		if err != nil {
			return nil, nil, err
		}
		if r.gv.Group == rbacv1.GroupName {
			main := stores[r.plural].(*mainREST)
			switch r.plural {
			case "roles":
				roles.roles = main.Store
			case "rolebindings":
				roles.roleBindings = main.Store
			case "clusterroles":
				roles.clusterRoles = main.Store
			case "clusterrolebindings":
				roles.clusterRoleBindings = main.Store
			}
			stores[r.plural] = &rbacREST{mainREST: main, authz: authz, resolver: ruleResolver{source: roles}}
		}
		storage := group(r.gv)
		for path, s := range stores {
			storage[path] = s
		}
	}
	for path, s := range reviewStores(authz) {
		group(authorizationv1.SchemeGroupVersion)[path] = s
	}
	group(authenticationv1.SchemeGroupVersion)["selfsubjectreviews"] = &selfSubjectReviewREST{}
	for _, g := range order {
		if g == "" {
			core = byGroup[g]
		} else {
			named = append(named, byGroup[g])
		}
	}
	return core, named, nil
}

// isBuiltinGroup reports whether a group is served by this file (CRDs of such a group
// are not added to discovery a second time).
func isBuiltinGroup(group string) bool {
	if group == authorizationv1.GroupName || group == authenticationv1.GroupName {
		return true
	}
	for _, r := range builtinResources {
		if r.gv.Group == group {
			return true
		}
	}
	return false
}
